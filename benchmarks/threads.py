"""Benchmark: normal training's step at 1 thread per op and at every core, for each model kind.

``runtime.intra_op_threads: auto`` gives a model its kind's record's threads per op
(:mod:`tfdist.model_kinds`): 1 for the mlp, every core of its process for any
other; this measures why, through the real train stage on all of this machine's
CPUs, the prepared digits tiled to 12,000.

    python -m benchmarks threads [--models mlp cnn] [--batches 25 256] [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

from typing import Any

from benchmarks.harness import Options, grid
from benchmarks.results import Result, median, spread
from benchmarks.stage import StageRuns, model_settings
from tfdist.hardware import usable_cpus

TITLE = "Normal training's ms/step at 1 thread per op and at every core"


def cells(options: Options) -> list[dict[str, Any]]:
    settings = sorted({1, len(usable_cpus())})
    return grid(options, threads_per_op=settings)


def setup(options: Options) -> StageRuns:
    return StageRuns.make("threads")


def measure(cell: dict[str, Any], context: StageRuns, options: Options) -> dict[str, float]:
    found = context.train("default", [*model_settings(cell, options), f"runtime.intra_op_threads={cell['threads_per_op']}"])
    return {"ms_per_step": found["step_ms"]}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """A row per model and batch: both settings side by side, and how much faster every core ran."""
    settings = sorted({cell.params["threads_per_op"] for cell in result.cells})
    rows = []
    for model, batch in dict.fromkeys((c.params["model"], c.params["batch"]) for c in result.cells):
        steps = [result.cell(model=model, batch=batch, threads_per_op=t).values("ms_per_step") for t in settings]
        rows.append([model, str(batch), *map(spread, steps), f"{median(steps[0]) / median(steps[-1]):.2f}x"])
    return (["model", "batch", *[f"{t} thread{'s' if t > 1 else ''} per op (ms/step)" for t in settings],
             f"{settings[-1]} threads faster by"], rows)
