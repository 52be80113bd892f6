"""Benchmark: what a backup within an epoch costs, and so what ``train.backup_every``'s default costs a run.

Normal training through the real train stage (the prepared digits tiled to
12,000), with no backup within an epoch and with one every 100 steps, the
settings alternating: the steady step's difference times 100 is one backup's
cost, and that cost over ``train.backup_every`` steps is the share of a run's
time the default interval takes (at most 2 %, params.yaml).

    python -m benchmarks backups [--models mlp cnn] [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

from typing import Any

from benchmarks.harness import Options, grid
from benchmarks.results import Result, median, spread
from benchmarks.stage import StageRuns, model_settings
from tfdist.config.knobs import TrainConfig

TITLE = "A backup within an epoch: its cost, and the default interval's share of a run's time"
DEFAULTS = {"models": ["mlp", "cnn"], "batches": [25], "epochs": 3, "rounds": 3}
#: Steps between backups in the measured runs: often enough that their cost stands out of the noise.
OFTEN = 100


def cells(options: Options) -> list[dict[str, Any]]:
    return grid(options, backup_every=[0, OFTEN])


def setup(options: Options) -> StageRuns:
    return StageRuns.make("backups")


def measure(cell: dict[str, Any], context: StageRuns, options: Options) -> dict[str, float]:
    found = context.train("default", [*model_settings(cell, options), f"train.backup_every={cell['backup_every']}"])
    return {"ms_per_step": found["step_ms"]}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """A row per model: its step without and with backups every 100 steps, one backup's cost, and the default
    interval's share of the run's time."""
    default = TrainConfig().backup_every
    rows = []
    for model, batch in dict.fromkeys((c.params["model"], c.params["batch"]) for c in result.cells):
        plain, often = (result.cell(model=model, batch=batch, backup_every=every).values("ms_per_step")
                        for every in (0, OFTEN))
        backup_ms = max(0.0, (median(often) - median(plain)) * OFTEN)
        rows.append([model, str(batch), spread(plain), spread(often), f"{backup_ms:.1f}",
                     f"{100 * backup_ms / (default * median(plain)):.2f} %"])
    return (["model", "batch", "ms/step, no backup within an epoch", f"ms/step, a backup every {OFTEN} steps",
             "ms a backup", f"share of the run at backup_every {default}"], rows)
