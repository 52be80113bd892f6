"""Benchmark: how often oneDNN's pass leaves a multi_worker_mirrored convnet's pooling gradient to Eigen's kernel,
and what retracing every worker together (``runtime.onednn_retraces``) does about it, side by side with not retracing.

Runs the train stage for multi_worker_mirrored with 2 workers through the local
launcher, alternating ``runtime.onednn_retraces`` 0 (checked and reported only)
and 3 (the default) round by round. Each run's report holds what every check
found on every worker (:class:`tfdist.train.kernels.KernelCheck`): the first
check, after the train function's first call, is the run as it was drawn; the
last is the run as it trained on. The prepared digits are tiled to 12,000.

    python -m benchmarks onednn_retraces [--batches 25] [--rounds 20] [--epochs 3] [--set settings=[0,3]]
"""

from __future__ import annotations

from typing import Any

from benchmarks.harness import Options, grid
from benchmarks.results import Cell, Result, spread
from benchmarks.stage import StageRuns, model_settings

TITLE = "The pooling gradient left to Eigen's kernel, with and without every worker retracing together"
DEFAULTS = {"models": ("cnn",), "batches": (25,), "rounds": 20, "extra": {}}
SETTINGS = (0, 3)


def cells(options: Options) -> list[dict[str, Any]]:
    return grid(options, retraces=options.extra.get("settings", SETTINGS))


def setup(options: Options) -> StageRuns:
    return StageRuns.make("onednn-retraces")


def _workers_left(findings: dict[str, Any]) -> float:
    return float(sum(bool(ops) for ops in findings.values()))


def measure(cell: dict[str, Any], context: StageRuns, options: Options) -> dict[str, float]:
    found = context.train("multi_worker_mirrored", [*model_settings(cell, options), "distributed.workers=2",
                                                    f"runtime.onednn_retraces={cell['retraces']}"])
    checks = found["kernel_checks"]
    if not checks:
        raise SystemExit("error: the run checked no kernels (oneDNN off in its workers?)")
    return {"workers_left_first": _workers_left(checks[0]), "workers_left_last": _workers_left(checks[-1]),
            "retraces": float(len(checks) - 1), "ms_per_step": found["step_ms"],
            "first_epoch_overhead_s": found["first_epoch_overhead_seconds"]}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """A row per setting: the rounds drawn with a worker on Eigen's kernel, those that trained on with one, and the
    step of the rounds that trained on oneDNN's everywhere and of those that did not."""
    rows = []
    for c in result.cells:
        drawn = sum(r["workers_left_first"] > 0 for r in c.rounds)
        kept = [r for r in c.rounds if r["workers_left_last"] > 0]
        clean = [r for r in c.rounds if r["workers_left_last"] == 0]
        rows.append([c.params["model"], str(c.params["batch"]), str(c.params["retraces"]),
                     f"{drawn} of {len(c.rounds)}", f"{len(kept)} of {len(c.rounds)}",
                     spread(c.values("retraces")),
                     spread(Cell(c.params, clean).values("ms_per_step")), spread(Cell(c.params, kept).values("ms_per_step")),
                     spread(c.values("first_epoch_overhead_s"))])
    return ["model", "per-replica batch", "runtime.onednn_retraces", "rounds drawn with a worker on Eigen's",
            "rounds that trained on with one", "retraces", "step (ms), oneDNN's everywhere",
            "step (ms), Eigen's in a worker", "1st-epoch overhead (s)"], rows
