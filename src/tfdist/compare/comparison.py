"""The comparison, typed: a row per run, the projection to more machines, the advice, and the whole.

Frozen records computed by :mod:`tfdist.compare.compute` and worded by
:mod:`tfdist.compare.advice`; :mod:`tfdist.compare.render` lays them out.
:func:`to_json` is the one place they become ``compare.json``'s dict (field
order kept: it is the file's key order).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tfdist.compare.noise import EPOCH_RESOLUTION, Interval
from tfdist.records.measures import declared, headlines, measure
from tfdist.records.reports import EvalReport, PrecisionSupport, TrainReport, from_dict


@dataclass(frozen=True)
class RunRow:
    """One run's line of the comparison: its reports as the stages wrote them, and how it compares with normal training.

    The report's own numbers stay in ``report`` and ``evaluation``; what the
    comparison adds is declared here like theirs (:mod:`tfdist.records.measures`), so the
    tables, metrics.json and the MLflow metrics read one declaration.

    Attributes:
        name: the run.
        report: its train report.
        evaluation: its results on the test split (the evaluate stage's).
        processes: "workers + ps" as one label ("2 + 1"), or the workers alone.
        given: the CPUs and op threads its processes were given, as one label
            ("2 CPUs, 2 threads per op"; "2 x 1 CPU, ..." for pinned workers).
        vs_normal: every ratio the train report declares against normal training's, by name
            (``speedup``: normal's steady epoch time over this run's; ``wall_speedup``: the same of ``fit``'s wall time).
        target_accuracy: ``compare.target_accuracy``.
        epochs_to_target, seconds_to_target: until validation accuracy first reached it (None: never).
        time_to_accuracy_speedup: normal training's seconds to the target over this run's (None: either never did).
        accuracy_delta_points: test accuracy against normal training's, in points.
        vs_normal_low, vs_normal_high: the interval of each ratio that has one (:mod:`tfdist.compare.noise`),
            by the ratio's name; empty for normal training and for reports without steady epochs to resample.
        interval_basis: what those intervals rest on (with one run each, the steady epochs within it).
        time_to_accuracy_low, time_to_accuracy_high: the interval of the speed-up to the target, from the
            epoch each run reached it in (None: either never did).
        repeats_to_decide: runs of each the spread measured would need to tell the speed-up from 1.0 (None: no spread).
        rounds: with ``compare.repeats`` above 1, every round's train report, round 1 first; ``report`` then
            holds the medians of their numbers, the time to target is the rounds' median, and every interval
            rests on the spread between rounds. Empty with one run each.
    """

    name: str
    report: TrainReport
    evaluation: EvalReport
    processes: str = field(metadata=measure(table="setup", heading="workers + ps"))
    given: str = field(metadata=measure(table="setup", heading="CPUs, threads"))
    vs_normal: dict[str, float | None]
    target_accuracy: float = field(metadata=measure(mlflow="target_accuracy"))
    epochs_to_target: int | None = field(metadata=measure(
        mlflow="epochs_to_target_accuracy", table="results", heading="epochs to target", missing="not reached",
        better="lower"))
    seconds_to_target: float | None = field(metadata=measure(
        mlflow="seconds_to_target_accuracy", table="results", heading="time to target (s)", format="{:.1f}",
        missing="not reached", better="lower", headline="seconds_to_target"))
    time_to_accuracy_speedup: float | None = field(metadata=measure(
        mlflow="time_to_accuracy_speedup", table="results", heading="speed-up to target", format="{:.2f}x",
        missing="not reached", better="higher", headline="time_to_accuracy_speedup",
        interval=("time_to_accuracy_low", "time_to_accuracy_high")))
    accuracy_delta_points: float = field(metadata=measure(table="results", heading="Δ accuracy (points)",
                                                          format="{:+.2f}", better="higher"))
    vs_normal_low: dict[str, float] = field(default_factory=dict, metadata=measure(mlflow="{key}_low"))
    vs_normal_high: dict[str, float] = field(default_factory=dict, metadata=measure(mlflow="{key}_high"))
    interval_basis: str = ""
    time_to_accuracy_low: float | None = field(default=None, metadata=measure(
        mlflow="time_to_accuracy_speedup_low", headline="time_to_accuracy_speedup_low"))
    time_to_accuracy_high: float | None = field(default=None, metadata=measure(
        mlflow="time_to_accuracy_speedup_high", headline="time_to_accuracy_speedup_high"))
    repeats_to_decide: int | None = field(default=None, metadata=measure(mlflow="repeats_to_decide"))
    rounds: list[TrainReport] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        """Normal training's steady epoch time over this run's."""
        return self.vs_normal.get("speedup") or 0.0

    @property
    def disturbed(self) -> str:
        """What disturbed its machine while it trained, in words (with repeats, naming each round it disturbed)."""
        if not self.rounds:
            return self.report.disturbed
        return "; ".join(f"round {index}: {report.disturbed}" for index, report in enumerate(self.rounds, 1)
                         if report.disturbed)

    @property
    def test_accuracy(self) -> float:
        return self.evaluation.accuracy

    def interval(self, ratio: str) -> Interval | None:
        """The interval of ratio ``ratio`` (``speedup``, ``throughput_speedup``, ``time_to_accuracy_speedup``), if it has one."""
        if ratio == "time_to_accuracy_speedup":
            low, high = self.time_to_accuracy_low, self.time_to_accuracy_high
            basis = self.interval_basis if self.rounds else EPOCH_RESOLUTION
        else:
            low, high, basis = self.vs_normal_low.get(ratio), self.vs_normal_high.get(ratio), self.interval_basis
        return None if low is None or high is None else Interval(low, high, basis)


#: Where a row's declared numbers live: the row's attributes holding records (``""``: the row itself), in table order.
ROW_RECORDS = ("report", "evaluation", "")


def headline_metrics(row: RunRow) -> dict[str, float]:
    """What metrics.json lists for ``row`` (``dvc exp show``): every declared headline, ratios included."""
    found = headlines(row.report)
    ratios = (declaration.ratio for _, declaration in declared(row.report) if declaration.ratio is not None)
    for ratio in ratios:
        if ratio.headline and (value := row.vs_normal.get(ratio.name)) is not None:
            found[ratio.name] = value
            if ratio.name in row.vs_normal_low:  # its interval, beside it in dvc exp show
                found[f"{ratio.name}_low"], found[f"{ratio.name}_high"] = (row.vs_normal_low[ratio.name],
                                                                           row.vs_normal_high[ratio.name])
    return {**found, **headlines(row.evaluation), **headlines(row)}


@dataclass(frozen=True)
class Network:
    """The network between machines the projection assumes (``compare.network_gbit``, ``compare.network_latency_us``)."""

    gbit: float
    latency_us: float

    @property
    def seconds_per_byte(self) -> float:
        return 8 / (self.gbit * 1e9)


@dataclass(frozen=True)
class Projection:
    """One all-reducing run projected onto N machines: ``step(N) = compute + overhead + ring all-reduce(N)``.

    Attributes:
        name: the run.
        workers: the workers its all-reduce was calibrated between.
        step_ms, all_reduce_here_ms: its measured step, the all-reduce's share of it.
        compute_ms: one replica's step timed alone in a worker (older reports: the step less the all-reduce).
        overhead_ms: the rest, neither compute nor the all-reduce: the strategy's own per-step work (its
            distributed input, host round trips, collective launches, waiting for the slower peer). Projected
            the same on any number of machines.
        gradient_bytes: what one all-reduce carries.
        normal_step_ms: normal training's step at the same per-replica batch.
        examples_per_machine: examples a worker takes per step.
        step_on_network_ms, projected_speedup: per machine count (as a string: a JSON key), the step on the
            assumed network and the speed against normal training.
        break_even_machines: the fewest machines that match normal training (None: never, or not within reach).
        ceiling_speedup: the speed-up however many machines (each adds 2 messages to every step).
        speedup_low, speedup_high: per machine count, the 95% band of ``projected_speedup`` from its measured
            terms' spread (empty where they have none recorded).
        break_even_fewest, break_even_most: the machines to break even across that band (most None: the
            band's bottom never reaches 1.0 within reach).
        ceiling_low, ceiling_high: the ceiling's band.
    """

    name: str
    workers: int
    step_ms: float
    all_reduce_here_ms: float
    compute_ms: float
    gradient_bytes: int
    normal_step_ms: float
    examples_per_machine: float
    step_on_network_ms: dict[str, float]
    projected_speedup: dict[str, float]
    break_even_machines: int | None
    ceiling_speedup: float
    speedup_low: dict[str, float] = field(default_factory=dict)
    speedup_high: dict[str, float] = field(default_factory=dict)
    break_even_fewest: int | None = None
    break_even_most: int | None = None
    ceiling_low: float | None = None
    ceiling_high: float | None = None
    overhead_ms: float = 0.0

    def break_even_text(self) -> str:
        """The machines to break even, with the band's range where it has one: ``3 machines (2-5)``; ``never``."""
        if self.break_even_machines is None:
            return "never"
        fewest, most = self.break_even_fewest, self.break_even_most
        spread = "" if fewest is None else f" ({fewest}-{most})" if most is not None else f" ({fewest} to never)"
        return f"{self.break_even_machines} machines{spread}"


@dataclass(frozen=True)
class Advice:
    """The answers, in words: what to use here, with more machines, which kind of parallelism, which precision,
    and whether the input holds the steps back ("" in comparisons made before it was said)."""

    use: str
    scale: str
    paradigms: str
    precision: str
    input: str = ""


@dataclass(frozen=True)
class Comparison:
    """Every run side by side (``normal`` first), the verdict, the advice and the projection (``compare.json``)."""

    verdict: str
    advice: Advice
    network: Network
    scaling: list[Projection]
    precision_support: dict[str, PrecisionSupport]
    cpu_count: int
    measured_on: str
    runs: dict[str, RunRow]

    @property
    def rows(self) -> list[RunRow]:
        """The runs in order, ``normal`` first."""
        return list(self.runs.values())


def rows_from_json(data: dict[str, Any], source: str) -> list[RunRow]:
    """The rows of a compare.json, typed again (each report checked as when the compare stage read it)."""
    return [from_dict(RunRow, row, f"{source}: runs.{name}") for name, row in data["runs"].items()]


def to_json(comparison: Comparison) -> dict[str, Any]:
    """``comparison`` as compare.json holds it (nested records as dicts, in field order)."""
    return dataclasses.asdict(comparison)

