"""The comparison: one table of every run, a verdict computed from it, figures.

Reads the train and eval reports the earlier stages wrote, so it needs
neither TensorFlow nor MLflow.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

from tfdist import atomic
from tfdist.errors import InputError

NORMAL = "normal"
# Below this ratio either way, a speed difference is within run-to-run noise.
_NOISE = 0.10

COLUMNS = (
    ("name", "run"),
    ("strategy", "strategy"),
    ("loop", "loop"),
    ("precision", "precision"),
    ("synchronous", "sync"),
    ("replicas", "replicas"),
    ("processes", "workers + ps"),
    ("global_batch_size", "global batch"),
    ("learning_rate", "learning rate"),
    ("samples_per_second", "samples/s"),
    ("steady_epoch_seconds", "s/epoch"),
    ("first_epoch_overhead_seconds", "1st-epoch overhead (s)"),
    ("train_seconds", "train time (s)"),
    ("speedup", "speed-up vs normal"),
    ("test_accuracy", "test accuracy"),
    ("accuracy_delta_points", "Δ accuracy (points)"),
)


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
        })
    return {"verdict": verdict(rows), "cpu_count": os.cpu_count(), "runs": {row["name"]: row for row in rows}}


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


def render_markdown(comparison: dict[str, Any]) -> str:
    """The comparison as GitHub-flavoured markdown, figures linked relatively."""
    header = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    lines = [
        "# Normal vs distributed training",
        "",
        comparison["verdict"],
        "",
        header,
        "|" + "|".join("---" if key in ("name", "strategy", "loop", "precision") else "---:" for key, _ in COLUMNS) + "|",
    ]
    for row in comparison["runs"].values():
        lines.append("| " + " | ".join(_cell(key, row[key]) for key, _ in COLUMNS) + " |")
    lines += [
        "",
        "Samples/s and s/epoch are steady state: training examples per second, and the median training time",
        "of the epochs after the first. The first epoch also traces the step functions (and connects a cluster):",
        "its overhead is shown apart. Speed-up is normal s/epoch divided by the run's. Train time is the wall",
        "time of Keras `fit` (all epochs, validation, tracing, per-epoch backups).",
        "Test accuracy is on the held-out test split; Δ accuracy is against normal training.",
        "Global batch is examples per optimizer step (per-replica `train.batch_size` × replicas in sync);",
        "learning rate is the effective rate after `train.lr_scaling` (and the one warm-up ramps to).",
        *_asynchronous_note(comparison["runs"].values()),
        *_precision_note(comparison["runs"].values()),
        "",
        "![throughput](figures/throughput.png)",
        "![accuracy vs time](figures/accuracy_vs_time.png)",
        "![loss curves](figures/loss_curves.png)",
        "",
    ]
    return "\n".join(lines)


def _asynchronous_note(rows: Any) -> list[str]:
    names = [row["name"] for row in rows if not row["synchronous"]]
    if not names:
        return []
    return [
        "",
        f"**Asynchronous:** {', '.join(names)} trained with parameter servers: each worker runs whole steps on its own",
        "and applies its updates to the variables on the ps without waiting for the other workers, so workers can",
        "compute on slightly stale weights. Its global batch is one worker's step (replicas per worker × batch size);",
        "an epoch is still one pass over the training data, shared by the workers. The other runs are synchronous:",
        "all replicas combine their gradients before every update.",
    ]


def _precision_note(rows: Any) -> list[str]:
    slow = sorted({row["precision"] for row in rows if not row["precision_can_be_faster"]})
    if not slow:
        return []
    return [
        "",
        f"**Precision:** this machine has no hardware that computes {', '.join(slow)} faster than float32 "
        "(see the run's `precision.hardware` tag in MLflow), so those runs show its cost, not a speed-up.",
    ]


def _cell(key: str, value: Any) -> str:
    if key == "train_seconds":
        return f"{value:.1f}"
    if key == "steady_epoch_seconds":
        return f"{value:.3f}"
    if key == "first_epoch_overhead_seconds":
        return f"{value:.2f}"
    if key == "samples_per_second":
        return f"{value:,.0f}"
    if key == "speedup":
        return f"{value:.2f}x"
    if key == "test_accuracy":
        return f"{value:.4f}"
    if key == "accuracy_delta_points":
        return f"{value:+.2f}"
    if key == "synchronous":
        return "sync" if value else "async"
    if key == "learning_rate":
        return f"{value:g}"
    return str(value)


def plot_figures(comparison: dict[str, Any], histories: dict[str, list[dict]], out_dir: Path) -> list[Path]:
    """Throughput bars, accuracy against time, and loss curves overlaid; returns the PNGs."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    rows = list(comparison["runs"].values())
    names = [r["name"] for r in rows]
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(names, [r["samples_per_second"] for r in rows], color="tab:blue")
    left.set(title="Training throughput", ylabel="samples / s")
    right.bar(names, [r["train_seconds"] for r in rows], color="tab:orange")
    right.set(title="Train time (fit wall time)", ylabel="seconds")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=30)
    paths.append(_save(plt, fig, out_dir / "throughput.png"))

    fig, axis = plt.subplots(figsize=(6, 4))
    for row in rows:
        axis.scatter(row["train_seconds"], row["test_accuracy"])
        axis.annotate(row["name"], (row["train_seconds"], row["test_accuracy"]), textcoords="offset points", xytext=(5, 5))
    axis.set(title="Test accuracy vs train time", xlabel="train time (s)", ylabel="test accuracy")
    paths.append(_save(plt, fig, out_dir / "accuracy_vs_time.png"))

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for name in names:
        epochs = [h["epoch"] for h in histories[name]]
        left.plot(epochs, [h["loss"] for h in histories[name]], marker="o", label=name)
        if all("val_loss" in h for h in histories[name]):
            right.plot(epochs, [h["val_loss"] for h in histories[name]], marker="o", label=name)
    left.set(title="Training loss", xlabel="epoch", ylabel="loss")
    right.set(title="Validation loss", xlabel="epoch")
    left.legend()
    paths.append(_save(plt, fig, out_dir / "loss_curves.png"))
    return paths


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return path
