"""Benchmark: a long epoch preempted, under each strategy: from the signal to the exit, and what the rerun costs.

The convnet, two epochs of the prepared digits tiled to 24,000 (``--set rows=N``), through the real
train stage. Per strategy, each round: an uninterrupted run; a run sent SIGTERM (to the stage, as a
scheduler does: a local cluster's launcher passes it on) at a random moment of its second epoch (the
first holds the start-up's tracing), then the same command again; the same with SIGKILL (to the
stage's whole process group: a machine lost), which leaves only the last backup. Reported: the
seconds from SIGTERM to exit, the step the rerun resumes at (a SIGTERM's backup is the step it
landed at, rounded up to a call of ``train.steps_per_execution`` steps; a SIGKILL's, the last
periodic backup: ``train.backup_every``, 2,000 steps by default), the rerun's wall time against the
uninterrupted run's, and what the preemption cost in all: the two runs' wall time less the
uninterrupted run's (a second start-up, the steps trained again).

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
from tfdist.errors import PREEMPTED_EXIT

TITLE = "A long epoch preempted: SIGTERM to exit, and the rerun against an uninterrupted run"
DEFAULTS = {"models": ["cnn"], "batches": [25], "epochs": 2, "rounds": 3,
            "extra": {"strategies": ["default", "mirrored", "multi_worker_mirrored", "parameter_server"],
                      "rows": 24_000}}
SIGNALS = ("none", "SIGTERM", "SIGKILL")
#: Where in the epoch the signal lands: a random moment between these fractions of it (as the stage's output
#: shows the epoch begin: under a launcher its lines come relayed, a little late; a preemption due at the last
#: epoch's last step is no preemption, the run ends).
MOMENTS = (0.2, 0.7)
_RESUMED = re.compile(r"resuming within epoch 2: its steps 1-(\d+) are done")
_FINISHED = re.compile(r"resuming from the backup in .*: (every epoch is done|epochs 1-2 are done)")


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
        whole = {"wall_s": time.monotonic() - started, "epoch_s": found["history"][-1]["epoch_seconds"],
                 "steps": found["steps_per_epoch"]}
        context.whole[cell["strategy"]] = whole
        return whole
    whole = context.whole[cell["strategy"]]
    at = context.moments.uniform(*MOMENTS) * whole["epoch_s"]
    started = time.monotonic()
    exit_s = _signalled(command, getattr(signal, cell["signal"]), at)
    preempted_s = time.monotonic() - started
    started = time.monotonic()
    rerun = subprocess.run(command, capture_output=True, text=True, check=True)
    rerun_s = time.monotonic() - started
    resumed = _RESUMED.search(rerun.stderr)
    resumed_at = int(resumed[1]) if resumed else whole["steps"] if _FINISHED.search(rerun.stderr) else 0
    return {"exit_s": exit_s, "resumed_at": resumed_at, "rerun_vs_whole": rerun_s / whole["wall_s"],
            "cost_s": preempted_s + rerun_s - whole["wall_s"]}


def _signalled(command: list[str], sent: int, after: float) -> float:
    """Run the stage, send ``sent`` ``after`` seconds into its last epoch (as its output shows it begin); the
    seconds it then took to end."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None
    for line in process.stdout:
        if re.search(r"Epoch (\d+)/\1", line):
            break
    time.sleep(after)
    if process.poll() is not None:
        raise SystemExit(f"the stage ended ({process.returncode}) before its {signal.Signals(sent).name}, "
                         f"{after:.1f} s into its last epoch:\n{process.stdout.read()[-2000:]}")
    signalled = time.monotonic()
    if sent == signal.SIGKILL:
        os.killpg(process.pid, signal.SIGKILL)  # the machine is lost: every task with the stage
    else:
        process.send_signal(sent)
    output = process.stdout.read()
    code = process.wait()
    expected = PREEMPTED_EXIT if sent == signal.SIGTERM else -signal.SIGKILL
    if code != expected:
        raise SystemExit(f"the stage sent {signal.Signals(sent).name} ended with {code}, not {expected}:\n{output[-2000:]}")
    return time.monotonic() - signalled


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """A row per strategy and signal: the exit's delay, where the rerun resumed, the rerun's wall time over the
    uninterrupted run's, and the preemption's cost in wall time."""
    rows = []
    for cell in result.cells:
        strategy, sent = cell.params["strategy"], cell.params["signal"]
        if sent == "none":
            rows.append([strategy, "none (uninterrupted)", "–", "–", "–",
                         f"{median(cell.values('wall_s')):.1f} s ({median(cell.values('epoch_s')):.1f} s epoch 2 of "
                         f"{median(cell.values('steps')):.0f} steps)"])
            continue
        rows.append([strategy, sent, spread(cell.values("exit_s"), 1) if sent == "SIGTERM" else "–",
                     spread(cell.values("resumed_at"), 0), spread(cell.values("rerun_vs_whole")),
                     f"+{spread(cell.values('cost_s'), 1)} s"])
    return (["strategy", "signal", "SIGTERM to exit (s)", "rerun resumed epoch 2 at step",
             "rerun's wall time / an uninterrupted run's", "the two runs' wall time"], rows)
