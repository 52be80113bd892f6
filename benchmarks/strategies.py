"""Benchmark 2: every strategy, through the real train stage, at per-replica batch 25 and 256.

Each configuration runs ``python -m stages.train`` in a scratch folder (its
own process and MLflow store, models not logged) on the prepared training
digits tiled to 12,000; the numbers come from the run's report: steady-state
samples/s and seconds per step (epochs after the first), first-epoch overhead,
start-up time, and scaling efficiency = samples/s / (normal samples/s x N),
where N is the replicas (or, for parameter_server, the workers).

    python -m benchmarks strategies [--epochs 4] [--batches 25 256]
"""

from __future__ import annotations

from typing import Any

from benchmarks.harness import Options, grid
from benchmarks.results import Result, median, spread
from benchmarks.stage import StageRuns, model_settings

TITLE = "Every strategy through the real train stage: throughput, step, scaling efficiency, warm-up and start-up"
DEFAULTS = {"models": ("mlp",), "epochs": 4}
CONFIGS = {  # label: strategy, overrides, N for scaling efficiency
    "normal": ("default", [], 1),
    "mirrored x1": ("mirrored", ["distributed.devices=1"], 1),
    "mirrored x2": ("mirrored", ["distributed.devices=2"], 2),
    "central_storage x2": ("central_storage", ["distributed.devices=2"], 2),
    "multi_worker_mirrored x1": ("multi_worker_mirrored", ["distributed.workers=1"], 1),
    "multi_worker_mirrored x2": ("multi_worker_mirrored", ["distributed.workers=2"], 2),
    "parameter_server 1 worker": ("parameter_server", ["distributed.workers=1"], 1),
    "parameter_server 2 workers": ("parameter_server", ["distributed.workers=2"], 2),
}


def cells(options: Options) -> list[dict[str, Any]]:
    return grid(options, run=list(CONFIGS))


def setup(options: Options) -> StageRuns:
    return StageRuns.make("strategies")


def measure(cell: dict[str, Any], context: StageRuns, options: Options) -> dict[str, float]:
    strategy, sets, _ = CONFIGS[cell["run"]]
    found = context.train(strategy, [*sets, *model_settings(cell, options)])
    return {"samples_per_second": found["steady_samples_per_second"], "ms_per_step": found["step_ms"],
            "replicas": found["replicas"], "global_batch": found["global_batch_size"],
            "first_epoch_overhead_s": found["first_epoch_overhead_seconds"], "startup_s": found["startup_seconds"]}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """A row per run, its speed against normal training's at the same model and batch, on the medians."""
    rows = []
    for cell in result.cells:
        normal = result.cell(model=cell.params["model"], batch=cell.params["batch"], run="normal")
        speed, base = median(cell.values("samples_per_second")), median(normal.values("samples_per_second"))
        n = CONFIGS[cell.params["run"]][2]
        rows.append([cell.params["run"], cell.params["model"], str(cell.params["batch"]),
                     f"{median(cell.values('replicas')):.0f}", f"{median(cell.values('global_batch')):.0f}",
                     spread(cell.values("samples_per_second"), 0), spread(cell.values("ms_per_step")),
                     f"{speed / base:.2f}x", f"{speed / (base * n):.0%}", spread(cell.values("first_epoch_overhead_s")),
                     spread(cell.values("startup_s"), 1)])
    return (["run", "model", "per-replica batch", "replicas", "global batch", "samples/s", "ms/step", "vs normal",
             "scaling efficiency", "1st-epoch overhead (s)", "start-up (s)"], rows)
