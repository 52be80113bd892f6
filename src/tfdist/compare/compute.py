"""The comparison's numbers: every run side by side, time to accuracy, and the projection to more machines.

Computes; neither words it (:mod:`tfdist.compare.advice`) nor lays it out
(:mod:`tfdist.compare.render`). Reads the typed train and eval reports the
earlier stages wrote, so it needs neither TensorFlow nor MLflow, and reasons
about hardware from what each report recorded where training ran.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfdist.compare.advice import PROJECTED_MACHINES, advice, verdict
from tfdist.compare.comparison import Comparison, Network, Projection, RunRow
from tfdist.compare.noise import (
    WITHIN_ONE_RUN,
    band,
    between_repeats,
    bootstrap_about,
    paired_interval,
    paired_repeats_to_decide,
    ratio_interval,
    repeats_to_decide,
    steady,
    time_to_accuracy_interval,
)
from tfdist.config.knobs import NORMAL_RUN, CompareConfig
from tfdist.errors import InputError
from tfdist.hardware import Hardware
from tfdist.records.measures import declared, median_record, ratios
from tfdist.records.reports import CollectiveCosts, EvalReport, TrainReport

#: One round of a run: its train report and per-epoch history.
Round = tuple[TrainReport, list[dict[str, float]]]


def build_comparison(train: dict[str, TrainReport], evaluation: dict[str, EvalReport],
                     histories: Mapping[str, list[dict[str, float]]] | None = None,
                     settings: CompareConfig | None = None, rounds: Mapping[str, Sequence[Round]] | None = None
                     ) -> Comparison:
    """Rows for every run (``normal`` first) plus the verdict, the advice and the projection to more machines.

    Args:
        train: train report per run name; must include ``normal``.
        evaluation: eval report per run name.
        histories: per-epoch history per run name (the train stage's CSV rows),
            for the time to ``settings.target_accuracy``; a run without one has none.
        settings: the ``compare:`` knobs (the target accuracy, the network projected onto); defaults if None.
        rounds: with repeats (``compare.repeats``), every round of every run, round 1 first: each row's
            numbers are then the medians of its rounds, its intervals the spread between them.
    """
    settings = settings or CompareConfig()
    target_accuracy = settings.target_accuracy
    if NORMAL_RUN not in train:
        raise InputError("the comparison needs the 'normal' run (stages/train.py --strategy default --name normal)")
    histories = histories or {}
    if rounds:
        train = {name: median_record([report for report, _ in rounds[name]]) for name in train}
        reached = {name: _reached_in_most(rounds[name], target_accuracy) for name in train}
    else:
        reached = {name: time_to_accuracy(histories.get(name, []), target_accuracy) for name in train}
    base, base_accuracy = train[NORMAL_RUN], evaluation[NORMAL_RUN].accuracy
    rows = [_row(train[name], evaluation[name], base=base, base_accuracy=base_accuracy, reached=reached[name],
                 base_reached=reached[NORMAL_RUN], target=target_accuracy)
            for name in [NORMAL_RUN, *sorted(n for n in train if n != NORMAL_RUN)]]
    rows = [_over_rounds(row, rounds[row.name], rounds[NORMAL_RUN]) if rounds else
            _with_intervals(row, histories.get(row.name, []), histories.get(NORMAL_RUN, []), base) for row in rows]
    support = dict(base.precision_support)
    network = Network(settings.network_gbit, settings.network_latency_us)
    projections = projection(rows, network, histories=histories)
    return Comparison(
        verdict=verdict(rows, projections, network),
        advice=advice(rows, projections, support, network),
        network=network,
        scaling=projections,
        precision_support=support,
        cpu_count=base.hardware.cpu_cores,
        measured_on=measured_on(base.hardware, base.dataset),
        runs={row.name: row for row in rows},
    )


def measured_on(hardware: Hardware, dataset: str = "") -> str:
    """Where the numbers come from, in one sentence: they hold for that machine and data, not for every one."""
    cpu = f"{hardware.cpu_model or 'CPU'}, {hardware.cpu_cores} cores"
    gpus = f"{len(hardware.gpu_models)} x {hardware.gpu_models[0]}" if hardware.gpu_models else "no GPU"
    data = f", training on {dataset}" if dataset else ""
    return (f"Measured on {', '.join(hardware.hosts)} ({cpu}, {gpus}){data}; the numbers are that machine's: "
            "run `dvc repro` to measure yours.")


def _row(report: TrainReport, result: EvalReport, *, base: TrainReport, base_accuracy: float,
         reached: tuple[int, float] | None, base_reached: tuple[int, float] | None, target: float) -> RunRow:
    """One run's line of the comparison: its reports, and how it compares with normal training."""
    epochs, seconds = reached or (None, None)
    return RunRow(
        name=report.name,
        report=report,
        evaluation=result,
        processes=f"{report.workers} + {report.ps}" if report.ps else str(report.workers),
        given=_given(report),
        vs_normal=ratios(report, base),
        target_accuracy=target,
        epochs_to_target=epochs,
        seconds_to_target=seconds,
        # normal's time to the target over the run's: the speed-up that counts the epochs each needed
        time_to_accuracy_speedup=base_reached[1] / seconds if seconds and base_reached else None,
        accuracy_delta_points=100 * (result.accuracy - base_accuracy),
    )


def _with_intervals(row: RunRow, history: list[dict[str, float]], normal_history: list[dict[str, float]],
                    base: TrainReport) -> RunRow:
    """``row`` with the interval of each ratio against normal training (:mod:`tfdist.compare.noise`), where it has one.

    Normal training's own row has none: it is the reference.
    """
    if row.name == NORMAL_RUN or not history or not normal_history:
        return row
    low, high = {}, {}
    for _, declaration in declared(row.report):
        ratio = declaration.ratio
        if ratio is None or ratio.samples is None or declaration.better is None:
            continue
        found = ratio_interval(steady(normal_history, ratio.samples), steady(history, ratio.samples), declaration.better,
                               around=row.vs_normal.get(ratio.name))
        if found is not None:
            low[ratio.name], high[ratio.name] = found.low, found.high
    speedup = row.vs_normal.get("speedup")
    repeats = repeats_to_decide(steady(normal_history, "epoch_seconds"), steady(history, "epoch_seconds"),
                                speedup) if speedup else None
    to_target = None
    if row.epochs_to_target and (normal_epochs := time_to_accuracy(normal_history, row.target_accuracy)):
        to_target = time_to_accuracy_interval(_epoch_span(normal_history, normal_epochs[0], base),
                                              _epoch_span(history, row.epochs_to_target, row.report))
    return dataclasses.replace(
        row, vs_normal_low=low, vs_normal_high=high, interval_basis=WITHIN_ONE_RUN if low else "",
        time_to_accuracy_low=to_target.low if to_target else None,
        time_to_accuracy_high=to_target.high if to_target else None, repeats_to_decide=repeats)


def _reached_in_most(rounds: Sequence[Round], target: float) -> tuple[int, float] | None:
    """The median epochs and seconds to ``target`` over the rounds that reached it; None unless most did."""
    reached = [found for _, history in rounds if (found := time_to_accuracy(history, target))]
    if 2 * len(reached) <= len(rounds):
        return None
    return round(statistics.median(epochs for epochs, _ in reached)), statistics.median(s for _, s in reached)


def _over_rounds(row: RunRow, rounds: Sequence[Round], normal_rounds: Sequence[Round]) -> RunRow:
    """``row`` (of the rounds' medians) with every round's report, and each ratio paired round by round.

    Each ratio is the median of the rounds' own (a round's run against normal
    training's same round, run next to it), its interval the bootstrap of that
    median over rounds (:func:`tfdist.compare.noise.paired_interval`).
    """
    reports = [report for report, _ in rounds]
    if row.name == NORMAL_RUN:
        return dataclasses.replace(row, rounds=reports)
    basis = between_repeats(len(rounds))
    normal_reports = [report for report, _ in normal_rounds]
    vs_normal, low, high = dict(row.vs_normal), {}, {}
    paired = _paired(reports, normal_reports)
    for name, per_round in paired.items():
        vs_normal[name] = statistics.median(per_round) if per_round else None
        if found := paired_interval(per_round, basis):
            low[name], high[name] = found.low, found.high
    to_target = [normal / run for normal, run in zip(_seconds_to(normal_rounds, row.target_accuracy),
                                                     _seconds_to(rounds, row.target_accuracy), strict=True)
                 if normal is not None and run is not None]
    interval = paired_interval(to_target, basis) if row.time_to_accuracy_speedup else None
    return dataclasses.replace(
        row, vs_normal=vs_normal, vs_normal_low=low, vs_normal_high=high, interval_basis=basis if low else "",
        time_to_accuracy_speedup=statistics.median(to_target) if interval else row.time_to_accuracy_speedup,
        time_to_accuracy_low=interval.low if interval else None,
        time_to_accuracy_high=interval.high if interval else None,
        repeats_to_decide=paired_repeats_to_decide(paired.get("speedup", [])), rounds=reports)


def _paired(reports: Sequence[TrainReport], normal_reports: Sequence[TrainReport]) -> dict[str, list[float]]:
    """Every declared ratio of each round's report against normal training's same round, by the ratio's name."""
    per_round: dict[str, list[float]] = {}
    for report, normal in zip(reports, normal_reports, strict=True):
        for name, value in ratios(report, normal).items():
            per_round.setdefault(name, [])
            if value is not None:
                per_round[name].append(value)
    return per_round


def _seconds_to(rounds: Sequence[Round], target: float) -> list[float | None]:
    """The training seconds to ``target`` of each round (None: that round never reached it)."""
    return [found[1] if (found := time_to_accuracy(history, target)) else None for _, history in rounds]


def _epoch_span(history: list[dict[str, float]], epoch: int, report: TrainReport) -> tuple[float, float]:
    """When, in training seconds, epoch ``epoch`` (1-based) began and ended; the first begins once its overhead is paid."""
    ends = training_seconds(history)
    start = ends[epoch - 2] if epoch > 1 else max(report.first_epoch_overhead_seconds, 0.0)
    return start, ends[epoch - 1]


def _given(report: TrainReport) -> str:
    """What a run's processes were given, as the report's setup table shows it."""
    threads = report.threads
    if threads is None:
        return "not recorded"
    cpus = f"{threads.cpus} CPU{'s' if threads.cpus != 1 else ''}"
    if report.workers > 1 and report.synchronous:  # one process a worker, each with the chief's share
        cpus = f"{report.workers} x {cpus}"
    per_op = f"{threads.intra_op} thread{'s' if threads.intra_op != 1 else ''} per op" if threads.intra_op else \
        "TensorFlow's threads per op"
    onednn = "" if threads.onednn is None else f", oneDNN {'on' if threads.onednn else 'off'}"
    return f"{cpus}, {per_op}{onednn}"


def training_seconds(history: list[dict[str, float]]) -> list[float]:
    """Each epoch's end in training seconds: the epochs' ``epoch_seconds`` added up (validation left out)."""
    total, ends = 0.0, []
    for row in history:
        total += row["epoch_seconds"]
        ends.append(total)
    return ends


def time_to_accuracy(history: list[dict[str, float]], target: float) -> tuple[int, float] | None:
    """The epochs and training seconds until validation accuracy first reached ``target``; None if it never did.

    The seconds add up the epochs' training time (:func:`training_seconds`: the first
    epoch's tracing and connecting included, validation left out, as in
    samples/s), so a run that needs more epochs pays for each of them.
    """
    for row, seconds in zip(history, training_seconds(history), strict=True):
        if row["val_accuracy"] >= target:
            return int(row["epoch"]), seconds
    return None


def all_reduce_seconds(machines: int, size: int, calibration: CollectiveCosts, network: Network | None) -> float:
    """A ring all-reduce of ``size`` bytes across ``machines``, from the costs calibrated between the workers here.

    A ring takes 2(N-1) messages one after another, each machine sending
    2(N-1)/N of the bytes (reduce-scatter, then all-gather). The calibration
    between W workers here gives each message's fixed cost (its latency over
    2(W-1)) and each byte's (per byte over 2(W-1)/W): what the processes spend
    whatever the wire. ``network`` adds the wire: its latency to each message,
    its transfer time to each byte (None: the wire here, already measured).
    """
    return ring_seconds(machines, size, calibration.latency_seconds, calibration.seconds_per_byte, calibration.workers,
                        network)


def ring_seconds(machines: int, size: int, latency: Any, per_byte: Any, workers: int, network: Network | None) -> Any:
    """:func:`all_reduce_seconds` from the calibration's two terms, floats or arrays of them (the projection's band)."""
    message = latency / (2 * (workers - 1))
    byte = per_byte / (2 * (workers - 1) / workers)
    if network is not None:
        message = message + network.latency_us * 1e-6
        byte = byte + network.seconds_per_byte
    return 2 * (machines - 1) * message + 2 * (machines - 1) / machines * size * byte


def projection(rows: list[RunRow], network: Network, most: int = 10_000,
               histories: Mapping[str, list[dict[str, float]]] | None = None) -> list[Projection]:
    """step(N) = compute + overhead + all-reduce(N) for every run that all-reduced across workers, measured here.

    What the run's measured step took beyond its all-reduce between the workers
    here (the train stage's calibration) is two terms: the compute, one
    replica's step timed alone in a worker (forward and backward pass, the
    update), and the overhead, the rest (the strategy's own per-step work:
    its distributed input, host round trips, collective launches, waiting for
    the slower peer; reports without the compute timed count it all as compute).
    With N machines, a worker each, the step keeps both and pays a ring
    all-reduce of its gradients over ``network``; speed against normal training
    is N workers' examples per step time against normal's. The messages grow
    with N while the bytes per machine level off, so the speed-up rises to a
    ceiling (a step that is all messages, 2 per added machine): the projection
    gives it, and the machines needed to match normal training (None: not
    within ``most``, or never, when the ceiling is below 1). Runs without a
    calibration (one machine's strategies, parameter_server's pulls and
    pushes) are not projected. With ``histories`` and the calibration's
    samples, each number also gets its 95% band (:func:`_with_band`).
    """
    normal = rows[0]
    return [_with_band(_projected(row, normal, network, most), row, normal, network, most, histories or {})
            for row in rows[1:] if row.report.paradigm == "data" and row.report.collectives]


def _with_band(projected: Projection, row: RunRow, normal: RunRow, network: Network, most: int,
               histories: Mapping[str, list[dict[str, float]]]) -> Projection:
    """``projected`` with the band its measured terms' spread gives each number.

    A bootstrap: the run's and normal training's steady throughput (their
    epochs) and both all-reduce probes (their calls) resampled together, the
    projection computed for each resample, and the central 95% of what it gave
    kept: the speed-up per machine count, the ceiling, and the machines to
    break even as the fewest (the band's top reaches 1.0) to the most (its
    bottom does; None: not within ``most``). Unchanged where a term has no spread recorded.
    """
    run, base, calibration = row.report, normal.report, row.report.collectives
    run_epochs = steady(histories.get(row.name, []), "samples_per_second")
    normal_epochs = steady(histories.get(normal.name, []), "samples_per_second")
    if (calibration is None or min(len(run_epochs), len(normal_epochs), len(calibration.small_samples),
                                   len(calibration.large_samples)) < 2):
        return projected
    rng = np.random.default_rng(0)
    step = run.global_batch_size / bootstrap_about(run_epochs, run.steady_samples_per_second, rng)
    base_speed = bootstrap_about(normal_epochs, base.steady_samples_per_second, rng)
    small = bootstrap_about(calibration.small_samples, calibration.small_seconds, rng)
    large = bootstrap_about(calibration.large_samples, calibration.large_seconds, rng)
    per_byte = np.maximum(0.0, (large - small) / (calibration.large_bytes - calibration.small_bytes))
    workers, size, per_machine = calibration.workers, calibration.large_bytes, projected.examples_per_machine
    rest = np.maximum(0.0, step - ring_seconds(workers, size, small, per_byte, workers, None))  # compute + overhead

    def speedups(machines: int) -> np.ndarray:
        return machines * per_machine / (rest + ring_seconds(machines, size, small, per_byte, workers, network)) / base_speed

    bands = {str(n): band(speedups(n)) for n in PROJECTED_MACHINES}
    ceiling = band(per_machine / ring_seconds(2, 0, small, per_byte, workers, network) / base_speed)
    fewest = most_machines = None
    if ceiling[1] > 1:
        for machines in range(2, most + 1):
            low, high = band(speedups(machines))
            fewest = fewest or (machines if high >= 1 else None)
            if low >= 1 or (fewest and ceiling[0] <= 1):  # the bottom reaches 1.0, or never will
                most_machines = machines if low >= 1 else None
                break
    return dataclasses.replace(
        projected, speedup_low={n: float(b[0]) for n, b in bands.items()},
        speedup_high={n: float(b[1]) for n, b in bands.items()}, break_even_fewest=fewest,
        break_even_most=most_machines, ceiling_low=float(ceiling[0]), ceiling_high=float(ceiling[1]))


def _projected(row: RunRow, normal: RunRow, network: Network, most: int) -> Projection:
    run, base = row.report, normal.report
    calibration = run.collectives
    assert calibration is not None  # projection() passes only calibrated runs
    step = run.global_batch_size / run.steady_samples_per_second
    size = calibration.large_bytes
    here = all_reduce_seconds(calibration.workers, size, calibration, None)
    rest = max(0.0, step - here)
    # compute timed alone where it was (older reports: the whole rest); the overhead, what is neither, a term of its own
    compute = rest if calibration.compute_seconds is None else min(rest, calibration.compute_seconds)
    overhead = rest - compute
    per_machine = run.global_batch_size / calibration.workers  # examples a worker takes per step

    def step_on_network(machines: int) -> float:
        return compute + overhead + all_reduce_seconds(machines, size, calibration, network)

    def speedup(machines: int) -> float:
        return machines * per_machine / step_on_network(machines) / base.steady_samples_per_second

    ceiling = per_machine / all_reduce_seconds(2, 0, calibration, network) / base.steady_samples_per_second
    return Projection(
        name=row.name,
        workers=calibration.workers,
        step_ms=1000 * step,
        all_reduce_here_ms=1000 * here,
        compute_ms=1000 * compute,
        overhead_ms=1000 * overhead,
        gradient_bytes=size,
        normal_step_ms=1000 * base.global_batch_size / base.replicas / base.steady_samples_per_second,
        examples_per_machine=per_machine,
        step_on_network_ms={str(n): 1000 * step_on_network(n) for n in PROJECTED_MACHINES},
        projected_speedup={str(n): speedup(n) for n in PROJECTED_MACHINES},
        break_even_machines=next((n for n in range(2, most + 1) if speedup(n) >= 1), None) if ceiling > 1 else None,
        ceiling_speedup=ceiling,
    )
