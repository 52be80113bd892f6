"""Benchmark: the multi-process strategies' step, this checkout against an earlier commit, side by side.

multi_worker_mirrored x2 and parameter_server (2 workers, 1 ps) through the
real train stage on loopback, per-replica batch 25 (and whatever ``--batches``
names), the prepared digits tiled to 12,000; normal training alongside as the
yardstick. A step is one synchronous step of the cluster, or under
parameter_server one worker's step (the compare report's "per worker" step:
its two workers step at once). The earlier commit (``--set before=REV``, a git
revision) runs from a worktree of it, with the same interpreter and packages;
within every cell the two run one after the other, each first in turn round by
round, and the harness alternates the cells round by round, so both see the same
machine. The table gives each step against normal training's of the same side
and round: the ratio the issue's targets are set in.

    python -m benchmarks multi_process_step [--set before=2b0a98e] [--models mlp] [--batches 25] [--rounds 3]
"""

from __future__ import annotations

import itertools
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import step_ms
from benchmarks.harness import Options, grid
from benchmarks.results import Result, median, spread
from benchmarks.stage import data_folder, run

REPO = Path(__file__).resolve().parent.parent
#: label: (strategy, settings, units taking steps at once)
RUNS = {
    "normal": ("default", [], 1),
    "multi_worker_mirrored x2": ("multi_worker_mirrored", ["distributed.workers=2"], 1),
    "parameter_server 2 workers": ("parameter_server", ["distributed.workers=2", "distributed.ps=1"], 2),
}
TITLE = "The multi-process strategies' step on loopback, this checkout against an earlier commit, side by side"
DEFAULTS = {"models": ("mlp",), "batches": (25,), "epochs": 3, "extra": {"before": "2b0a98e"}}


@dataclass(frozen=True)
class Context:
    root: Path
    data: Path
    before: Path
    runs: itertools.count = field(default_factory=itertools.count)
    measured: Counter = field(default_factory=Counter)  # rounds each cell has run: which side goes first


def cells(options: Options) -> list[dict[str, Any]]:
    return grid(options, run=list(RUNS))


def setup(options: Options) -> Context:
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-mpstep-"))
    before = root / "before"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(before), str(options.extra["before"])],
                   check=True, capture_output=True)
    return Context(root, data_folder(root), before)


def teardown(context: Context) -> None:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(context.before)], capture_output=True)


def measure(cell: dict[str, Any], context: Context, options: Options) -> dict[str, float]:
    strategy, sets, units = RUNS[cell["run"]]
    sets = [*sets, f"model.kind={cell['model']}", f"train.batch_size={cell['batch']}", f"train.epochs={options.epochs}"]
    found = {}
    sides = [("before", context.before), ("now", None)]
    key = tuple(sorted(cell.items()))
    if context.measured[key] % 2:  # round by round, each side first in turn: neither always runs on a warmer machine
        sides.reverse()
    context.measured[key] += 1
    for side, checkout in sides:
        name = f"{cell['model']}-b{cell['batch']}-{strategy}-{side}-{next(context.runs)}"
        started = time.monotonic()
        report = run(context.root, context.data, name, strategy, sets, checkout)
        found[f"{side}_stage_s"] = time.monotonic() - started  # the whole stage: start-up, launch, training, outputs
        found[f"{side}_ms"] = units * step_ms(report)
        found[f"{side}_accuracy"] = report["val_accuracy"]
    return found


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """Per model, batch and run: the step before and now, how much faster, and each side's step x normal's."""
    before = result.options["before"]
    rows = []
    for cell in result.cells:
        model, batch = cell.params["model"], cell.params["batch"]
        normal = result.cell(model=model, batch=batch, run="normal")
        ratios = {side: [mine[f"{side}_ms"] / yardstick[f"{side}_ms"]
                         for mine, yardstick in zip(cell.rounds, normal.rounds if normal else [], strict=False)]
                  for side in ("before", "now")}
        old, new = cell.values("before_ms"), cell.values("now_ms")
        walls = [cell.values(f"{side}_stage_s") if "now_stage_s" in cell.rounds[0] else [] for side in ("before", "now")]
        rows.append([model, str(batch), cell.params["run"], spread(old), spread(new), f"{median(old) / median(new):.2f}x",
                     spread(ratios["before"]) + "x", spread(ratios["now"]) + "x",
                     " / ".join(spread(wall) for wall in walls),
                     f"{median(cell.values('before_accuracy')):.4f} / {median(cell.values('now_accuracy')):.4f}"])
    return (["model", "per-replica batch", "run", f"ms/step at {before}", "ms/step now", "faster",
             f"x normal at {before} (per round)", "x normal now (per round)", "stage s before / now",
             "val accuracy before / now"], rows)
