"""Benchmark: normal training's step at 1 thread per op and at every core, for each model kind.

``runtime.intra_op_threads: auto`` gives a model its kind's record's threads per op
(:mod:`tfdist.model_kinds`): 1 for the seed MLP, every core of its process for any
other; this measures why, through the real train stage on all of this machine's
CPUs, the prepared digits tiled to 12,000.

    python -m benchmarks threads [--models mlp cnn] [--batches 25 256] [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import step_ms
from benchmarks.harness import Options
from benchmarks.results import Result, median, spread
from benchmarks.stage import data_folder, run
from tfdist.hardware import usable_cpus

TITLE = "Normal training's ms/step at 1 thread per op and at every core"


def cells(options: Options) -> list[dict[str, Any]]:
    settings = sorted({1, len(usable_cpus())})
    return [{"model": model, "batch": batch, "threads_per_op": threads}
            for model in options.models for batch in options.batches for threads in settings]


def setup(options: Options) -> tuple[Path, Path, itertools.count]:
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-threads-"))
    return root, data_folder(root), itertools.count()


def measure(cell: dict[str, Any], context: tuple[Path, Path, itertools.count], options: Options) -> dict[str, float]:
    root, data, runs = context
    report = run(root, data, f"run{next(runs)}", "default", [
        f"model.kind={cell['model']}", f"train.batch_size={cell['batch']}", f"train.epochs={options.epochs}",
        f"runtime.intra_op_threads={cell['threads_per_op']}"])
    return {"ms_per_step": step_ms(report)}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """A row per model and batch: both settings side by side, and how much faster every core ran."""
    settings = sorted({cell.params["threads_per_op"] for cell in result.cells})
    rows = []
    for model, batch in dict.fromkeys((c.params["model"], c.params["batch"]) for c in result.cells):
        steps = [result.cell(model=model, batch=batch, threads_per_op=t).values("ms_per_step") for t in settings]
        rows.append([model, str(batch), *map(spread, steps), f"{median(steps[0]) / median(steps[-1]):.2f}x"])
    return (["model", "batch", *[f"{t} thread{'s' if t > 1 else ''} per op (ms/step)" for t in settings],
             f"{settings[-1]} threads faster by"], rows)
