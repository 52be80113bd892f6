"""Benchmark: data, model and pipeline parallelism on the same model, through the real train stage.

Every run uses the custom loop (pipeline_parallel needs it) at per-replica
batch 25 on the prepared digits tiled to 12,000, each in its own process; the
rounds alternate the configurations so machine noise spreads over all.
Reported: steady samples/s and ms per step, speed vs normal, parameters on
the busiest device, bytes moved per step, and the bubble measured and in theory.

    python -m benchmarks paradigms [--rounds 2] [--epochs 3]
"""

from __future__ import annotations

from typing import Any

from benchmarks.harness import Options, grid
from benchmarks.results import Result, median, spread
from benchmarks.stage import StageRuns, model_settings

TITLE = "Data, model and pipeline parallelism on one model, custom loop: speed, what a device holds and moves, the bubble"
DEFAULTS = {"models": ("mlp",), "batches": (25,), "rounds": 2}
CONFIGS = {  # label: strategy, overrides
    "normal": ("default", []),
    "mirrored x2 (data)": ("mirrored", []),
    "model_parallel x2 (model)": ("model_parallel", []),
    "pipeline_parallel x2, M=5": ("pipeline_parallel", ["distributed.micro_batches=5"]),
    "pipeline_parallel x2, M=25": ("pipeline_parallel", ["distributed.micro_batches=25"]),
}


def cells(options: Options) -> list[dict[str, Any]]:
    return grid(options, run=list(CONFIGS))


def setup(options: Options) -> StageRuns:
    return StageRuns.make("paradigms")


def measure(cell: dict[str, Any], context: StageRuns, options: Options) -> dict[str, float]:
    strategy, sets = CONFIGS[cell["run"]]
    found = context.train(strategy, [*sets, "train.loop=custom", *model_settings(cell, options)])
    return {"samples_per_second": found["steady_samples_per_second"], "ms_per_step": found["step_ms"],
            "params_per_device": max(found["params_per_device"]), "bytes_per_step": found["bytes_per_step"],
            "bubble": found["bubble"], "bubble_theory": found["bubble_theory"]}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    rows = []
    for c in result.cells:
        normal = result.cell(model=c.params["model"], batch=c.params["batch"], run="normal")
        bubble, theory = c.values("bubble"), c.values("bubble_theory")
        rows.append([c.params["run"], spread(c.values("samples_per_second"), 0), spread(c.values("ms_per_step")),
                     f"{median(c.values('samples_per_second')) / median(normal.values('samples_per_second')):.2f}x",
                     f"{median(c.values('params_per_device')):,.0f}", f"{median(c.values('bytes_per_step')):,.0f}",
                     f"{median(bubble):.0%}" if bubble else "–", f"{median(theory):.0%}" if theory else "–"])
    return (["run", "samples/s", "ms/step", "vs normal", "parameters on a device", "bytes moved per step",
             "bubble measured", "bubble in theory"], rows)
