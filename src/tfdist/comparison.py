"""The comparison's numbers and words: every run side by side, the verdict, the advice.

Reads the train and eval reports the earlier stages wrote, so it needs
neither TensorFlow nor MLflow. :mod:`tfdist.report_pages` lays it out as
markdown, HTML and figures.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

from tfdist.config import MIXED_PRECISIONS
from tfdist.errors import InputError

NORMAL = "normal"
# Below this ratio either way, a speed difference is within run-to-run noise.
_NOISE = 0.10
# Test accuracy lost (points) past which the advice says so.
_ACCURACY_LOSS_POINTS = 1.0
#: Device counts the scaling advice projects to.
PROJECTED_DEVICES = (4, 8)


def run_label(name: str, strategy: str, replicas: int, workers: int, ps: int, loop: str, precision: str,
              clip: str = "none") -> str:
    """A run's title in MLflow, saying what differs between runs: ``mirrored ×2 · fit · float32``.

    The scale is the replicas in sync, or workers and parameter servers; the
    strategy is named apart when the run's name is not the strategy's (and it distributes).
    """
    scale = f" {workers}w+{ps}ps" if ps else (f" ×{replicas}" if replicas > 1 else "")
    head = f"{name}{scale}" if name == strategy or strategy == "default" else f"{name} ({strategy}{scale})"
    return " · ".join([head, loop, precision, *([f"clip {clip}"] if clip != "none" else [])])


def read_json(path: Path) -> dict[str, Any]:
    """Read one report, naming the file and the stage to run when it is missing."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"{path} not found; run the stages that write it (dvc repro)") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path} is not valid JSON ({err}); rerun the stage that writes it") from None


def read_history(path: Path) -> list[dict[str, float]]:
    """Read a per-epoch history CSV written by the train stage."""
    try:
        with open(path, newline="") as handle:
            return [{key: float(value) for key, value in row.items()} for row in csv.DictReader(handle)]
    except FileNotFoundError:
        raise InputError(f"{path} not found; run the train stage (dvc repro)") from None


def build_comparison(train: dict[str, dict], evaluation: dict[str, dict]) -> dict[str, Any]:
    """Rows for every run (``normal`` first) plus the verdict.

    Args:
        train: train report per run name; must include ``normal``.
        evaluation: eval report per run name.
    """
    if NORMAL not in train:
        raise InputError("the comparison needs the 'normal' run (stages/train.py --strategy default --name normal)")
    base = train[NORMAL]
    base_accuracy = evaluation[NORMAL]["accuracy"]
    rows = []
    for name in [NORMAL, *sorted(n for n in train if n != NORMAL)]:
        report, result = train[name], evaluation[name]
        rows.append({
            "name": name,
            "strategy": report["strategy"],
            "strategy_class": report["strategy_class"],
            "loop": report.get("loop", "fit"),
            "precision": report.get("precision", "float32"),
            "clip": report.get("clip_method", "none"),
            "precision_can_be_faster": report.get("precision_can_be_faster", True),
            "synchronous": report.get("synchronous", True),
            "replicas": report["replicas"],
            "workers": report.get("workers", 1),
            "ps": report.get("ps", 0),
            "processes": _processes(report),
            "devices": report["devices"],
            "global_batch_size": report["global_batch_size"],
            "learning_rate": report["learning_rate"],
            "lr_scaling": report.get("lr_scaling", "none"),
            "warmup_steps": report.get("warmup_steps", 0),
            "epochs": report["epochs"],
            "train_seconds": report["train_seconds"],
            "samples_per_second": report.get("steady_samples_per_second", report["samples_per_second"]),
            "steady_epoch_seconds": _steady(report),
            "first_epoch_overhead_seconds": report.get("first_epoch_overhead_seconds", 0.0),
            "startup_seconds": report.get("startup_seconds"),
            "speedup": _steady(base) / _steady(report),
            "wall_speedup": base["train_seconds"] / report["train_seconds"],
            "test_accuracy": result["accuracy"],
            "test_loss": result["loss"],
            "accuracy_delta_points": 100 * (result["accuracy"] - base_accuracy),
            "mlflow_run_id": report.get("mlflow_run_id"),
            "run_label": report.get("run_label", name),
        })
    support = base.get("precision_support", {})
    projections = scaling(rows)
    return {
        "verdict": verdict(rows),
        "advice": advice(rows, projections, support),
        "scaling": projections,
        "precision_support": support,
        "cpu_count": os.cpu_count(),
        "runs": {row["name"]: row for row in rows},
    }


def _steady(report: dict[str, Any]) -> float:
    """Steady-state seconds per epoch; reports from before it was measured fall back to the mean."""
    return report.get("steady_epoch_seconds") or report["train_seconds"] / report["epochs"]


def _processes(report: dict[str, Any]) -> str:
    workers, ps = report.get("workers", 1), report.get("ps", 0)
    return f"{workers} + {ps}" if ps else str(workers)


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
    return f"{head} {_why(best, normal)}"


def _why(best: dict[str, Any], normal: dict[str, Any]) -> str:
    devices = best["devices"]
    on_cpus = not any("gpu" in d.lower() for d in devices)
    if on_cpus and best["workers"] > 1:
        servers = f" and {best['ps']} parameter server(s)" if best["ps"] else ""
        return (f"Its {best['workers']} worker processes{servers} shared the same {os.cpu_count()} CPU cores when run "
                "locally, so they add no compute, while every step pays for gRPC traffic between the processes "
                "(all-reduce, or pushing updates to the ps); distribution pays with separate machines or GPUs.")
    if on_cpus and best["replicas"] > 1:
        return (f"Its {best['replicas']} replicas are logical devices carved out of the same "
                f"{os.cpu_count()} CPU cores, so they add no compute, while every step pays for "
                "splitting the batch and combining gradients; distribution pays with separate GPUs or machines.")
    if best["replicas"] > normal["replicas"]:
        return (f"It ran {best['replicas']} replicas on {', '.join(devices)}, each taking "
                f"1/{best['replicas']} of a {best['global_batch_size']}-example global batch.")
    return "It ran one replica, so it could only add overhead."




def scaling(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What each distributed run's measured step cost means with a device per replica.

    A *unit* is what would get hardware of its own: a replica in sync, or a
    worker of an asynchronous run. Its step (per-replica batch, coordination
    included) is ``units x per-replica batch / samples/s``. With N units on
    separate devices each as fast as this machine was for normal training,
    and the per-step coordination as measured, training would run at
    ``N x normal step / unit step`` of normal speed. On shared cores the
    measured step also holds the other replicas' compute, so this errs low.
    """
    normal = rows[0]
    normal_step = normal["global_batch_size"] / normal["replicas"] / normal["samples_per_second"]
    projections = []
    for row in rows[1:]:
        units = row["replicas"] if row["synchronous"] else row["workers"]
        step = units * row["global_batch_size"] / row["replicas"] / row["samples_per_second"]
        per_unit = normal_step / step
        projections.append({
            "name": row["name"],
            "unit": "workers" if row["workers"] > 1 else "devices",
            "units": units,
            "step_ms": 1000 * step,
            "normal_step_ms": 1000 * normal_step,
            "break_even_units": 1 / per_unit,
            "projected_speedup": {str(n): n * per_unit for n in PROJECTED_DEVICES},
        })
    return projections


def advice(rows: list[dict[str, Any]], projections: list[dict[str, Any]], support: dict[str, dict]) -> dict[str, str]:
    """Three answers, from the numbers (and their :func:`scaling`) and the hardware: what to use here,
    with more devices, and precision."""
    return {"use": _use_advice(rows), "scale": _scale_advice(projections), "precision": _precision_advice(rows, support)}


def _use_advice(rows: list[dict[str, Any]]) -> str:
    others = rows[1:]
    if not others:
        return "Train without distribution: it is the only run. List strategies under distributed.strategies to compare."
    best = max(others, key=lambda r: r["speedup"])
    if best["speedup"] < 1 + _NOISE:
        return (f"Train without distribution on this machine (the `normal` run): no strategy beat it at steady state; "
                f"the closest, {best['name']}, ran at {best['speedup']:.2f}x. Distribution spends time coordinating "
                f"replicas that, here, share {os.cpu_count()} CPU cores instead of adding compute.")
    text = (f"Use {best['name']}: it trained {best['speedup']:.2f}x as fast as normal training at steady state, "
            f"with test accuracy {best['accuracy_delta_points']:+.1f} points.")
    if best["accuracy_delta_points"] < -_ACCURACY_LOSS_POINTS:
        text += (f" The accuracy it lost comes with its {best['global_batch_size']}-example global batch: try "
                 "`train.lr_scaling: linear` with `train.warmup_epochs: 1`, or more epochs.")
    return text


def _scale_advice(projections: list[dict[str, Any]]) -> str:
    if not projections:
        return "No distributed run was measured, so there is nothing to project."
    best = min(projections, key=lambda p: p["break_even_units"])
    n = str(PROJECTED_DEVICES[-1])
    return (f"Each strategy's step cost is measured against normal training's {best['normal_step_ms']:.2f} ms per "
            f"step. With a device (or machine) per replica, as fast as this one, the least costly, {best['name']}, "
            f"would need {best['break_even_units']:.1f} {best['unit']} to match normal training and would run "
            f"{best['projected_speedup'][n]:.1f}x as fast with {n}. The table below projects every strategy; it "
            "assumes the per-step coordination stays as measured (true of ring all-reduce, whose traffic per device "
            "barely grows with the device count) and errs low where replicas shared cores here.")


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
