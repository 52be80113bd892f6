"""The comparison's numbers and words: every run side by side, the verdict, the advice.

Computes; does not lay out (:mod:`tfdist.compare.render` renders it as
markdown, HTML and figures). Reads the typed train and eval reports the
earlier stages wrote, so it needs neither TensorFlow nor MLflow, and reasons
about hardware from what each report recorded where training ran.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tfdist.config import MIXED_PRECISIONS, NORMAL_RUN, CompareConfig
from tfdist.distribute.registry import splits_layers
from tfdist.errors import InputError
from tfdist.hardware import Hardware
from tfdist.reports import EvalReport, TrainReport

# Below this ratio either way, a speed difference is within run-to-run noise.
_NOISE = 0.10
# Test accuracy lost (points) past which the advice says so.
_ACCURACY_LOSS_POINTS = 1.0
#: Machine counts the projection shows.
PROJECTED_MACHINES = (2, 4, 8, 16)
#: How far the projection was checked (docs/performance.md section 10, benchmarks/emulated_machines.py): the advice says so.
CHECKED = ("Checked on 2 emulated machines (a core and a network namespace each, the cable shaped with tc; "
           "docs/performance.md section 10): the projected step came within 14 % of the measured one at "
           "1 Gbit/s and 100 Mbit/s, per-replica batch 25 and 256; beyond 2 machines, and on a real network, "
           "it is unchecked.")


def build_comparison(train: dict[str, TrainReport], evaluation: dict[str, EvalReport],
                     histories: Mapping[str, list[dict[str, float]]] | None = None,
                     settings: CompareConfig | None = None) -> dict[str, Any]:
    """Rows for every run (``normal`` first) plus the verdict, the advice and the projection to more machines.

    Args:
        train: train report per run name; must include ``normal``.
        evaluation: eval report per run name.
        histories: per-epoch history per run name (the train stage's CSV rows),
            for the time to ``settings.target_accuracy``; a run without one has none.
        settings: the ``compare:`` knobs (the target accuracy, the network projected onto); defaults if None.
    """
    settings = settings or CompareConfig()
    target_accuracy = settings.target_accuracy
    if NORMAL_RUN not in train:
        raise InputError("the comparison needs the 'normal' run (stages/train.py --strategy default --name normal)")
    base, base_accuracy = train[NORMAL_RUN], evaluation[NORMAL_RUN].accuracy
    histories = histories or {}
    reached = {name: time_to_accuracy(histories.get(name, []), target_accuracy) for name in train}
    rows = [_row(train[name], evaluation[name], base, base_accuracy)
            | _time_to_accuracy_row(reached[name], reached[NORMAL_RUN], target_accuracy)
            for name in [NORMAL_RUN, *sorted(n for n in train if n != NORMAL_RUN)]]
    support = {name: dataclasses.asdict(found) for name, found in base.precision_support.items()}
    network = Network(settings.network_gbit, settings.network_latency_us)
    projections = projection(rows, network)
    return {
        "verdict": verdict(rows),
        "advice": advice(rows, projections, support, network),
        "network": dataclasses.asdict(network),
        "scaling": projections,
        "precision_support": support,
        "cpu_count": base.hardware.cpu_cores,
        "measured_on": measured_on(base.hardware),
        "runs": {row["name"]: row for row in rows},
    }


def measured_on(hardware: Hardware) -> str:
    """Where the numbers come from, in one sentence: they hold for that machine, not for every one."""
    cpu = f"{hardware.cpu_model or 'CPU'}, {hardware.cpu_cores} cores"
    gpus = f"{len(hardware.gpu_models)} x {hardware.gpu_models[0]}" if hardware.gpu_models else "no GPU"
    return (f"Measured on {', '.join(hardware.hosts)} ({cpu}, {gpus}); the numbers are that machine's: "
            "run `dvc repro` to measure yours.")


def _row(report: TrainReport, result: EvalReport, base: TrainReport, base_accuracy: float) -> dict[str, Any]:
    """One run's line of the comparison: its setup, its costs, and how it compares with normal training."""
    return {
        "name": report.name,
        "strategy": report.strategy,
        "paradigm": report.paradigm,
        "strategy_class": report.strategy_class,
        "loop": report.loop,
        "precision": report.precision,
        "clip": report.clip_method,
        "precision_can_be_faster": report.precision_can_be_faster,
        "synchronous": report.synchronous,
        "replicas": report.replicas,
        "workers": report.workers,
        "ps": report.ps,
        "processes": f"{report.workers} + {report.ps}" if report.ps else str(report.workers),
        "devices": report.devices,
        "hosts": report.hardware.hosts,
        "device_kinds": report.hardware.device_kinds,
        "cpu_cores": report.hardware.cpu_cores,
        "shared_cpu": report.hardware.shared_cpu,
        "global_batch_size": report.global_batch_size,
        "learning_rate": report.learning_rate,
        "lr_scaling": report.lr_scaling,
        "warmup_steps": report.warmup_steps,
        "epochs": report.epochs,
        "train_seconds": report.train_seconds,
        "samples_per_second": report.steady_samples_per_second,
        "steady_epoch_seconds": report.steady_epoch_seconds,
        "first_epoch_overhead_seconds": report.first_epoch_overhead_seconds,
        "startup_seconds": report.startup_seconds,
        "cpu_percent": report.cpu_percent,
        "params_per_device": report.params_per_device,
        "max_params_per_device": max(report.params_per_device),
        "bytes_per_step": report.bytes_per_step,
        "stages": report.stages,
        "micro_batches": report.micro_batches,
        "bubble": report.bubble,
        "bubble_theory": report.bubble_theory,
        "speedup": base.steady_epoch_seconds / report.steady_epoch_seconds,
        "wall_speedup": base.train_seconds / report.train_seconds,
        "test_accuracy": result.accuracy,
        "test_loss": result.loss,
        "accuracy_delta_points": 100 * (result.accuracy - base_accuracy),
        "mlflow_run_id": report.mlflow_run_id,
        "run_label": report.run_label,
        "collectives": dataclasses.asdict(report.collectives) if report.collectives else None,
    }


def time_to_accuracy(history: list[dict[str, float]], target: float) -> tuple[int, float] | None:
    """The epochs and training seconds until validation accuracy first reached ``target``; None if it never did.

    The seconds add up the epochs' training time (``epoch_seconds``: the first
    epoch's tracing and connecting included, validation left out, as in
    samples/s), so a run that needs more epochs pays for each of them.
    """
    seconds = 0.0
    for row in history:
        seconds += row["epoch_seconds"]
        if row["val_accuracy"] >= target:
            return int(row["epoch"]), seconds
    return None


def _time_to_accuracy_row(reached: tuple[int, float] | None, base: tuple[int, float] | None,
                          target: float) -> dict[str, Any]:
    epochs, seconds = reached or (None, None)
    return {
        "target_accuracy": target,
        "epochs_to_target": epochs,
        "seconds_to_target": seconds,
        # normal's time to the target over the run's: the speed-up that counts the epochs each needed
        "time_to_accuracy_speedup": base[1] / seconds if reached and base else None,
    }


def verdict(rows: list[dict[str, Any]]) -> str:
    """One or two sentences, from the numbers, on whether distributing paid off and why."""
    normal, others = rows[0], rows[1:]
    if not others:
        return "Only normal training ran; list strategies under distributed.strategies to compare."
    best = max(others, key=lambda r: r["speedup"])
    accuracy = f"test accuracy {best['test_accuracy']:.3f} vs {normal['test_accuracy']:.3f}"
    pace = (f"{best['steady_epoch_seconds']:.3f} s vs {normal['steady_epoch_seconds']:.3f} s per epoch at "
            "steady state")
    if best["speedup"] >= 1 + _NOISE:
        head = (f"Distribution paid off: {best['name']} trained {best['speedup']:.2f}x as fast as normal training "
                f"({pace}, {accuracy}).")
    elif best["speedup"] > 1 - _NOISE:
        head = (f"Distribution did not pay off: the fastest strategy, {best['name']}, ran within "
                f"{100 * _NOISE:.0f}% of normal training ({pace}, {accuracy}).")
    else:
        head = (f"Distribution did not pay off on this hardware: the fastest strategy, {best['name']}, ran at "
                f"{best['speedup']:.2f}x the speed of normal training ({pace}, {accuracy}).")
    return " ".join(part for part in (head, _to_target(best, normal, others), _why(best, normal)) if part)


def _to_target(best: dict[str, Any], normal: dict[str, Any], others: list[dict[str, Any]]) -> str:
    """What time to accuracy adds to the throughput verdict: said only where it tells a different story."""
    target = f"{best['target_accuracy']:.2f} validation accuracy"
    if normal["seconds_to_target"] is None:
        return ""  # nothing to compare with: the report's table says "not reached"
    if best["seconds_to_target"] is None:
        return (f"But {best['name']} never reached {target} in its {best['epochs']} epochs, which normal training did "
                f"in {normal['epochs_to_target']} ({normal['seconds_to_target']:.1f} s of training).")
    first = min((row for row in others if row["seconds_to_target"] is not None),
                key=lambda row: row["seconds_to_target"])
    ratio = best["time_to_accuracy_speedup"]
    paid, paid_to_target = best["speedup"] >= 1 + _NOISE, ratio >= 1 + _NOISE
    if paid == paid_to_target and first is best:
        return ""
    text = (f"To {target}, {best['name']} took {best['epochs_to_target']} epochs and "
            f"{best['seconds_to_target']:.1f} s against normal training's {normal['epochs_to_target']} and "
            f"{normal['seconds_to_target']:.1f} s ({ratio:.2f}x in time to accuracy)")
    if first is not best:
        text += (f"; {first['name']} got there first of the distributed runs, "
                 f"{first['time_to_accuracy_speedup']:.2f}x normal training's pace")
    return text + "."


def _why(best: dict[str, Any], normal: dict[str, Any]) -> str:
    """Why the best run went as fast as it did, from the hardware its report recorded where it trained."""
    cores = best["cpu_cores"]
    if best["stages"] > 1:
        shared = f", logical devices sharing the same {cores} CPU cores" if best["shared_cpu"] else ""
        overlap = ("its micro-batches overlap the stages only in part" if best["micro_batches"] > 1
                   else "only one stage works at a time")
        return (f"It split the model's layers over {best['stages']} devices ({', '.join(best['devices'])}{shared}): "
                f"every step moves activations and their gradients between them, and {overlap}; "
                "a split pays when the model does not fit one device.")
    if best["shared_cpu"] and best["workers"] > 1:
        servers = f" and {best['ps']} parameter server(s)" if best["ps"] else ""
        return (f"Its {best['workers']} worker processes{servers} shared the same {cores} CPU cores of one machine, "
                "so they add no compute, while every step pays for gRPC traffic between the processes "
                "(all-reduce, or pushing updates to the ps); distribution pays with separate machines or GPUs.")
    if best["shared_cpu"] and best["replicas"] > 1:
        return (f"Its {best['replicas']} replicas are logical devices carved out of the same "
                f"{cores} CPU cores, so they add no compute, while every step pays for "
                "splitting the batch and combining gradients; distribution pays with separate GPUs or machines.")
    if best["workers"] > 1 and len(best["hosts"]) > 1:
        return (f"It ran {best['workers']} workers on {len(best['hosts'])} machines ({', '.join(best['hosts'])}), "
                f"{best['replicas']} replicas in all, each taking part of a {best['global_batch_size']}-example global batch.")
    if best["replicas"] > normal["replicas"]:
        return (f"It ran {best['replicas']} replicas on {', '.join(best['devices'])}, each taking "
                f"1/{best['replicas']} of a {best['global_batch_size']}-example global batch.")
    return "It ran one replica, so it could only add overhead."


@dataclasses.dataclass(frozen=True)
class Network:
    """The network between machines the projection assumes (``compare.network_gbit``, ``compare.network_latency_us``)."""

    gbit: float
    latency_us: float

    @property
    def seconds_per_byte(self) -> float:
        return 8 / (self.gbit * 1e9)


def all_reduce_seconds(machines: int, size: int, calibration: Mapping[str, Any], network: Network | None) -> float:
    """A ring all-reduce of ``size`` bytes across ``machines``, from the costs calibrated between the workers here.

    A ring takes 2(N-1) messages one after another, each machine sending
    2(N-1)/N of the bytes (reduce-scatter, then all-gather). The calibration
    between W workers here gives each message's fixed cost (its latency over
    2(W-1)) and each byte's (per byte over 2(W-1)/W): what the processes spend
    whatever the wire. ``network`` adds the wire: its latency to each message,
    its transfer time to each byte (None: the wire here, already measured).
    """
    workers = calibration["workers"]
    message = calibration["latency_seconds"] / (2 * (workers - 1))
    per_byte = calibration["seconds_per_byte"] / (2 * (workers - 1) / workers)
    if network is not None:
        message += network.latency_us * 1e-6
        per_byte += network.seconds_per_byte
    return 2 * (machines - 1) * message + 2 * (machines - 1) / machines * size * per_byte


def projection(rows: list[dict[str, Any]], network: Network, most: int = 10_000) -> list[dict[str, Any]]:
    """step(N) = compute + all-reduce(N) for every run that all-reduced across workers, its terms measured here.

    The compute of a step is what the run's measured step took beyond its
    all-reduce between the workers here (the train stage's calibration): the
    forward and backward pass, the update, the strategy's own work. With N
    machines, a worker each, the step keeps that compute and pays a ring
    all-reduce of its gradients over ``network``; speed against normal training
    is N workers' examples per step time against normal's. The messages grow
    with N while the bytes per machine level off, so the speed-up rises to a
    ceiling (a step that is all messages, 2 per added machine): the projection
    gives it, and the machines needed to match normal training (None: not
    within ``most``, or never, when the ceiling is below 1). Runs without a
    calibration (one machine's strategies, parameter_server's pulls and
    pushes) are not projected.
    """
    normal = rows[0]
    return [_projected(row, normal, network, most) for row in rows[1:]
            if row["paradigm"] == "data" and row.get("collectives")]


def _projected(row: dict[str, Any], normal: dict[str, Any], network: Network, most: int) -> dict[str, Any]:
    calibration = row["collectives"]
    step = row["global_batch_size"] / row["samples_per_second"]
    size = calibration["large_bytes"]
    here = all_reduce_seconds(calibration["workers"], size, calibration, None)
    compute = max(0.0, step - here)
    per_machine = row["global_batch_size"] / calibration["workers"]  # examples a worker takes per step

    def step_on_network(machines: int) -> float:
        return compute + all_reduce_seconds(machines, size, calibration, network)

    def speedup(machines: int) -> float:
        return machines * per_machine / step_on_network(machines) / normal["samples_per_second"]

    ceiling = per_machine / all_reduce_seconds(2, 0, calibration, network) / normal["samples_per_second"]
    return {
        "name": row["name"],
        "workers": calibration["workers"],
        "step_ms": 1000 * step,
        "all_reduce_here_ms": 1000 * here,
        "compute_ms": 1000 * compute,
        "gradient_bytes": size,
        "normal_step_ms": 1000 * normal["global_batch_size"] / normal["replicas"] / normal["samples_per_second"],
        "examples_per_machine": per_machine,
        "step_on_network_ms": {str(n): 1000 * step_on_network(n) for n in PROJECTED_MACHINES},
        "projected_speedup": {str(n): speedup(n) for n in PROJECTED_MACHINES},
        "break_even_machines": next((n for n in range(2, most + 1) if speedup(n) >= 1), None) if ceiling > 1 else None,
        "ceiling_speedup": ceiling,
    }


def advice(rows: list[dict[str, Any]], projections: list[dict[str, Any]], support: dict[str, dict],
           network: Network) -> dict[str, str]:
    """Answers from the numbers (and their :func:`projection`) and the hardware: what to use here, with more
    machines, which kind of parallelism, and precision."""
    return {"use": _use_advice(rows), "scale": _scale_advice(rows, projections, network),
            "paradigms": _paradigm_advice(rows),
            "precision": _precision_advice(rows, support)}


def _paradigm_advice(rows: list[dict[str, Any]]) -> str:
    """When data, model and pipeline parallelism each pay, with what these runs held, moved and idled."""
    split = [row for row in rows if splits_layers(row["paradigm"])]
    data = [row for row in rows if row["paradigm"] == "data"]
    when = ("Data parallelism pays when the model fits one device and each replica gets a batch big enough to hide "
            "the gradient exchange; model parallelism pays only when the model (with its optimizer state) does not "
            "fit one device, as its stages work one after the other; pipeline parallelism then keeps them busy "
            "together, the more so the more micro-batches per stage (bubble (S-1)/(M+S-1)), if the link between "
            "devices carries the activations faster than a stage computes them.")
    if not split:
        return (when + " Only data parallelism ran here: add `model_parallel` and `pipeline_parallel` (with "
                "`train.loop: custom`) to `distributed.strategies` to measure the other two.")
    parts = []
    for row in split:
        bubble = "" if row["bubble"] is None else (
            f", and its devices idled {row['bubble']:.0%} of a step (theory {row['bubble_theory']:.0%} for "
            f"{row['stages']} stages and {row['micro_batches']} micro-batch{'es' if row['micro_batches'] > 1 else ''})")
        parts.append(f"{row['name']} held at most {row['max_params_per_device']:,} parameters on a device and moved "
                     f"{_kilobytes(row['bytes_per_step'])} of activations per step{bubble}; it ran at "
                     f"{row['speedup']:.2f}x normal speed")
    text = when + " Here: " + "; ".join(parts) + "."
    if data:
        least = min(data, key=lambda row: row["bytes_per_step"])
        text += (f" Data parallelism kept all {least['max_params_per_device']:,} parameters on every replica and "
                 f"moved {_kilobytes(least['bytes_per_step'])} per step at the least ({least['name']}).")
    if rows[0]["cpu_cores"] <= 2 and all(kind == "CPU" for kind in rows[0]["device_kinds"]):
        text += (" The devices here are logical CPU devices sharing the same cores, so a split adds per-op "
                 "overhead and no compute: the measured idle share reflects that overhead more than the schedule.")
    return text


def _kilobytes(count: int) -> str:
    return f"{count / 1024:,.0f} KiB" if count >= 1024 else f"{count} bytes"


def _use_advice(rows: list[dict[str, Any]]) -> str:
    others = rows[1:]
    if not others:
        return "Train without distribution: it is the only run. List strategies under distributed.strategies to compare."
    best = max(others, key=lambda r: r["speedup"])
    if best["speedup"] < 1 + _NOISE:
        return (f"Train without distribution on this machine (the `normal` run): no strategy beat it at steady state; "
                f"the closest, {best['name']}, ran at {best['speedup']:.2f}x. Distribution spends time coordinating "
                f"replicas that, here, share {rows[0]['cpu_cores']} CPU cores instead of adding compute.")
    text = (f"Use {best['name']}: it trained {best['speedup']:.2f}x as fast as normal training at steady state, "
            f"with test accuracy {best['accuracy_delta_points']:+.1f} points.")
    if best["accuracy_delta_points"] < -_ACCURACY_LOSS_POINTS:
        text += (f" The accuracy it lost comes with its {best['global_batch_size']}-example global batch: try "
                 "`train.lr_scaling: linear` with `train.warmup_epochs: 1`, or more epochs.")
    return text


def _scale_advice(rows: list[dict[str, Any]], projections: list[dict[str, Any]], network: Network) -> str:
    unprojected = [row for row in rows[1:] if row["paradigm"] == "data" and not row.get("collectives")]
    one_machine = [row["name"] for row in unprojected if row["synchronous"]]
    pulls = [row["name"] for row in unprojected if not row["synchronous"]]
    reasons = [*([f"{' and '.join(one_machine)} (one machine's devices)"] if one_machine else []),
               *([f"{' and '.join(pulls)} (its pulls and pushes to the parameter servers are not modelled)"]
                 if pulls else [])]
    left_out = f" Not projected: {'; '.join(reasons)}." if reasons else ""
    if not projections:
        return ("No run all-reduced across workers, so there is nothing to project to more machines: add "
                "`multi_worker_mirrored` to `distributed.strategies`." + left_out)
    p = min(projections, key=lambda p: (p["break_even_machines"] or 1 << 30, -p["ceiling_speedup"]))
    n = str(PROJECTED_MACHINES[-1])
    rests = (f"{p['name']}'s step is modelled as compute plus a ring all-reduce: {p['compute_ms']:.2f} ms of compute "
             f"(its measured {p['step_ms']:.2f} ms a step, less the {p['all_reduce_here_ms']:.2f} ms its all-reduce of "
             f"{_kilobytes(p['gradient_bytes'])} of gradients cost between the {p['workers']} workers here, as the "
             f"train stage calibrated it), and per machine 2(N-1) messages and 2(N-1)/N of the bytes on a "
             f"{network.gbit:g} Gbit/s network with {network.latency_us:g} µs latency (`compare.network_gbit`, "
             f"`compare.network_latency_us`).")
    ceiling = (f"however many machines, each adds 2 messages to every step, which caps it at "
               f"{p['ceiling_speedup']:.2f}x normal speed")
    if p["break_even_machines"] is None:
        verdict_text = (f" On that network it never matches normal training's {p['normal_step_ms']:.2f} ms step "
                        f"({p['projected_speedup'][n]:.2f}x with {n} machines): {ceiling}.")
    else:
        verdict_text = (f" It would need {p['break_even_machines']} machines to match normal training "
                        f"({p['normal_step_ms']:.2f} ms a step) and would run {p['projected_speedup'][n]:.2f}x as fast "
                        f"with {n}; {ceiling}.")
    return rests + verdict_text + " " + CHECKED + left_out


def _precision_advice(rows: list[dict[str, Any]], support: dict[str, dict]) -> str:
    used = sorted({row["precision"] for row in rows})
    per_replica_batch = rows[0]["global_batch_size"] // rows[0]["replicas"]
    # bfloat16 first: it needs no loss scaling, so it works under every strategy.
    faster = sorted((p for p in MIXED_PRECISIONS if support.get(p, {}).get("can_be_faster")), key=lambda p: p != "mixed_bfloat16")
    text = ""
    slow_used = [name for name in used if name != "float32" and name not in faster and name in support]
    if slow_used:
        text = (f"These runs used {', '.join(slow_used)}, which no unit here computes faster than float32: "
                "switch back to float32, it only costs here. ")
    if faster:
        choice = faster[0]
        return text + (
            f"{choice} can pay off here ({support[choice]['reason']}) once matrix multiplies dominate a step: a "
            f"per-replica batch well above {per_replica_batch}, or wider layers. At small batches a step is mostly "
            "per-op overhead and the casts cost about what they save. Measure it side by side: "
            f"`dvc exp run -S train.precision={choice} -S train.batch_size=256`, then `dvc exp show`."
            + ("" if choice != "mixed_float16" else
               " mixed_float16 needs loss scaling, which central_storage and parameter_server do not support.")
        )
    if not support:
        return text + "The train report does not say what this machine's hardware supports; rerun the train stages."
    reasons = "; ".join(support[name]["reason"] for name in MIXED_PRECISIONS if name in support)
    return text + (f"Mixed precision would not pay off on this machine: {reasons}. It pays on GPUs with tensor cores "
                   "(float16 from compute capability 7.0, bfloat16 from 8.0), on TPUs, and on CPUs with AVX512-BF16 "
                   "or AMX.")
