"""Benchmark: multi_worker_mirrored's all-reduce, auto vs ring (``distributed.all_reduce``), side by side.

Two local workers on loopback, the real train stage, per-replica batch 25 and
256 on the prepared digits tiled to 12,000; auto and ring alternate round by
round, each run in its own processes. On CPUs TensorFlow's AUTO resolves to
ring collectives, so the two should agree; NCCL needs GPUs on every worker.

    python -m benchmarks all_reduce [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

from typing import Any

from benchmarks.harness import Options, grid
from benchmarks.results import Result, median, spread
from benchmarks.stage import StageRuns, model_settings

TITLE = "multi_worker_mirrored's ms/step with distributed.all_reduce auto and ring, 2 workers on loopback"
DEFAULTS = {"models": ("mlp",)}
IMPLEMENTATIONS = ("auto", "ring")


def cells(options: Options) -> list[dict[str, Any]]:
    return grid(options, all_reduce=IMPLEMENTATIONS)


def setup(options: Options) -> StageRuns:
    return StageRuns.make("allreduce")


def measure(cell: dict[str, Any], context: StageRuns, options: Options) -> dict[str, float]:
    found = context.train("multi_worker_mirrored", [
        f"distributed.all_reduce={cell['all_reduce']}", "distributed.workers=2", *model_settings(cell, options)])
    return {"ms_per_step": found["step_ms"]}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    rows = []
    for cell in result.cells:
        auto = result.cell(model=cell.params["model"], batch=cell.params["batch"], all_reduce="auto")
        rows.append([cell.params["model"], str(cell.params["batch"]), cell.params["all_reduce"],
                     spread(cell.values("ms_per_step")),
                     f"{median(cell.values('ms_per_step')) / median(auto.values('ms_per_step')):.2f}x"])
    return ["model", "per-replica batch", "all_reduce", "ms/step", "vs auto"], rows
