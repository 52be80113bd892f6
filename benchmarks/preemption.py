"""Benchmark: a long epoch preempted, under each strategy: from the signal to the exit, and what the rerun costs.

The convnet, one epoch of the prepared digits tiled to 24,000 (``--set rows=N``), through
the real train stage. Per strategy, each round: an uninterrupted run; a run sent SIGTERM
(to the stage, as a scheduler does: a local cluster's launcher passes it on) at a random
moment of its epoch, then the same command again; the same with SIGKILL (to the stage's
whole process group: a machine lost), which leaves only the last backup. Reported: the
seconds from SIGTERM to exit, the step the rerun resumes at, the rerun's wall time against
the uninterrupted run's, and the steps lost (done before the signal, not in the backup the
rerun starts from; estimated from the uninterrupted run's step time: at most
``train.backup_every``, 2,000 by default, and the execution in flight).

    python -m benchmarks preemption [--rounds 3] [--set strategies=[default,multi_worker_mirrored]]
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness import Options
from benchmarks.results import Result, median, spread
from benchmarks.stage import StageRuns, measured, stage_command

TITLE = "A long epoch preempted: SIGTERM to exit, and the rerun against an uninterrupted run"
DEFAULTS = {"models": ["cnn"], "batches": [25], "epochs": 1, "rounds": 3,
            "extra": {"strategies": ["default", "mirrored", "multi_worker_mirrored", "parameter_server"],
                      "rows": 24_000}}
SIGNALS = ("none", "SIGTERM", "SIGKILL")
#: Where in the epoch the signal lands: a random moment between these fractions of it.
MOMENTS = (0.2, 0.9)
_RESUMED = re.compile(r"resuming within epoch 1: its steps 1-(\d+) are done")


@dataclass
class Context:
    runs: StageRuns
    moments: random.Random = field(default_factory=lambda: random.Random(58))
    whole: dict[str, dict[str, float]] = field(default_factory=dict)  # per strategy: its last uninterrupted run


def cells(options: Options) -> list[dict[str, Any]]:
    return [{"strategy": strategy, "signal": sent} for strategy in options.extra["strategies"] for sent in SIGNALS]


def setup(options: Options) -> Context:
    return Context(StageRuns.make("preemption", options.extra["rows"]))


def measure(cell: dict[str, Any], context: Context, options: Options) -> dict[str, float]:
    sets = ["model.kind=cnn", f"train.batch_size={options.batches[0]}", f"train.epochs={options.epochs}",
            "distributed.workers=1" if cell["strategy"] == "parameter_server" else "distributed.workers=2"]
    name = context.runs.name()
    command = stage_command(context.runs.root, context.runs.data, name, cell["strategy"], sets)
    if cell["signal"] == "none":
        started = time.monotonic()
        subprocess.run(command, check=True, capture_output=True)
        found = measured(context.runs.root, name)
        whole = {"wall_s": time.monotonic() - started, "epoch_s": found["history"][0]["epoch_seconds"],
                 "steps": found["steps_per_epoch"]}
        context.whole[cell["strategy"]] = whole
        return whole
    whole = context.whole[cell["strategy"]]
    signalled = _signalled(command, getattr(signal, cell["signal"]), context.moments.uniform(*MOMENTS) * whole["epoch_s"])
    started = time.monotonic()
    rerun = subprocess.run(command, capture_output=True, text=True, check=True)
    rerun_s = time.monotonic() - started
    resumed = _RESUMED.search(rerun.stderr)
    resumed_at = int(resumed[1]) if resumed else 0
    steps_done = signalled["after_s"] * whole["steps"] / whole["epoch_s"]
    return {"at_step": round(steps_done), "exit_s": signalled["exit_s"], "resumed_at": resumed_at,
            "lost_steps": max(0.0, steps_done - resumed_at) if cell["signal"] == "SIGKILL" else 0.0,
            "rerun_vs_whole": rerun_s / whole["wall_s"]}


def _signalled(command: list[str], sent: int, after: float) -> dict[str, float]:
    """Run the stage, send ``sent`` ``after`` seconds into its epoch; the seconds it then took to end."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    assert process.stdout is not None
    for line in process.stdout:
        if "Epoch 1/" in line:
            break
    began = time.monotonic()
    time.sleep(after)
    signalled = time.monotonic()
    if sent == signal.SIGKILL:
        os.killpg(process.pid, signal.SIGKILL)  # the machine is lost: every task with the stage
    else:
        process.send_signal(sent)
    process.stdout.read()
    code = process.wait()
    return {"after_s": signalled - began, "exit_s": time.monotonic() - signalled, "code": code}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """A row per strategy and signal: where it landed, the exit's delay, where the rerun resumed, the steps lost,
    and the rerun's wall time over the uninterrupted run's."""
    rows = []
    for cell in result.cells:
        if cell.params["signal"] == "none":
            rows.append([cell.params["strategy"], "none", "–", "–", "–", "–",
                         f"{median(cell.values('epoch_s')):.1f} s epoch, {median(cell.values('wall_s')):.1f} s run"])
            continue
        rows.append([cell.params["strategy"], cell.params["signal"], spread(cell.values("at_step"), 0),
                     spread(cell.values("exit_s"), 1) if cell.params["signal"] == "SIGTERM" else "–",
                     spread(cell.values("resumed_at"), 0), spread(cell.values("lost_steps"), 0),
                     spread(cell.values("rerun_vs_whole"))])
    return (["strategy", "signal", "at step", "SIGTERM to exit (s)", "rerun resumed at step", "steps lost",
             "rerun's wall time / an uninterrupted run's"], rows)
