"""Crash points: named moments of a stage's life where a test can make the whole stage die, for real.

In the spirit of SQLite's crash tests: the claim "a stage killed at any moment
leaves nothing behind, and its rerun ends as if it had never been killed" is
proven by killing it at every step that writes something, not at moments a
timer happens to hit (tests/test_crash_points.py walks every point).

``TFDIST_CRASH_AT=POINT`` (or ``POINT@N``: its N-th pass in one process) makes
the process that reaches ``POINT`` SIGKILL the stage: the process group of the
stage's first process and its own. A task of a local cluster (in a session of
its own) thus takes its launcher with it, and the launcher's other tasks die
with their parent (``PR_SET_PDEATHSIG``), as on a machine that lost power.
The stage must lead its process group (started with ``setsid``, or
``start_new_session=True``): a crash must never reach the program that started
it, so a stage that does not lead its group refuses the switch.

The switch is for tests; with it unset every point is a dictionary lookup.
"""

from __future__ import annotations

import collections
import os
import signal
from dataclasses import dataclass

from tfdist import native_logs

#: The switch: ``POINT`` or ``POINT@N``.
CRASH_ENV = "TFDIST_CRASH_AT"

#: The stage's process group, set by :func:`arm_crash_points` in its first process and inherited by its tasks.
CRASH_GROUP_ENV = "TFDIST_CRASH_GROUP"

#: The stages, by name, and the points each passes (every one in :data:`CRASH_POINTS`' order).
CRASH_STAGES = ("preprocess", "train", "evaluate", "compare")

_EVERY = CRASH_STAGES
_TRAIN = ("train",)


@dataclass(frozen=True)
class CrashPoint:
    """Where a stage can be killed: which stages pass the point, and what is on disk and in MLflow when it is hit."""

    stages: tuple[str, ...]
    state: str


#: Every point, in the order a stage passes them.
CRASH_POINTS: dict[str, CrashPoint] = {
    "start": CrashPoint(_EVERY, "params read, outputs checked writable, a killed run's staging swept; nothing written"),
    "train.strategy": CrashPoint(_TRAIN, "the strategy built (a cluster joined), no data read"),
    "train.data": CrashPoint(_TRAIN, "the prepared data and the backup read, no MLflow run opened"),
    "backup.step": CrashPoint(_TRAIN, "a backup within an epoch checkpointed, steps.json still naming the one "
                                      "before (walked at the second: epoch 1's first is in steps.json)"),
    "epoch.trained": CrashPoint(_TRAIN, "an epoch trained, not yet backed up (walked in epoch 2: epoch 1 is backed up)"),
    "backup.state": CrashPoint(_TRAIN, "an epoch's row in the backup's state.json, its weights not yet checkpointed"),
    "backup.written": CrashPoint(_TRAIN, "an epoch backed up whole (state.json and weights), its metrics not yet sent"),
    "model.written": CrashPoint(_TRAIN, "the model saved in its staging folder, not logged to the run"),
    "model.logged": CrashPoint(_TRAIN, "the model logged to the MLflow run (and registered), the summary metrics not"),
    "run.summary": CrashPoint(("train", "evaluate", "compare"),
                              "the metrics logged to the MLflow run; train's run not yet ended, no output in place"),
    "outputs.staged": CrashPoint(_EVERY, "every output written in its staging folder, none in place "
                                         "(train: its run ended FINISHED)"),
    "outputs.commit": CrashPoint(_EVERY, "the first output renamed into place (or a folder's old one moved away), "
                                         "the others not"),
    "outputs.committed": CrashPoint(_EVERY, "every output in place, the staging folders not yet removed; "
                                            "train's backup not yet removed"),
}


def crash_points_of(stage: str) -> list[str]:
    """The points ``stage`` passes, in order."""
    return [name for name, point in CRASH_POINTS.items() if stage in point.stages]

_passes: collections.Counter[str] = collections.Counter()


def arm_crash_points() -> None:
    """Record the stage's process group for its tasks, where the switch is set; a stage first thing calls it.

    Raises:
        RuntimeError: the switch is set in a process that does not lead its
            process group and has no stage group to kill: the crash would kill
            whatever started it.
    """
    wanted = os.environ.get(CRASH_ENV)
    if not wanted or os.environ.get(CRASH_GROUP_ENV):
        return
    point = wanted.partition("@")[0]
    if point not in CRASH_POINTS:
        raise RuntimeError(f"{CRASH_ENV}={wanted}: no such crash point (known: {', '.join(CRASH_POINTS)})")
    if os.getpgrp() != os.getpid():
        raise RuntimeError(f"{CRASH_ENV} is set but this stage does not lead its process group: start it with setsid")
    os.environ[CRASH_GROUP_ENV] = str(os.getpgrp())


def crash_point(name: str) -> None:
    """Kill the stage here if the switch names this point (and this is its N-th pass); otherwise nothing."""
    wanted = os.environ.get(CRASH_ENV)
    if not wanted:
        return
    assert name in CRASH_POINTS, f"undeclared crash point {name}"
    point, _, nth = wanted.partition("@")
    if point != name:
        return
    _passes[name] += 1
    if _passes[name] < int(nth or 1):
        return
    group = os.environ.get(CRASH_GROUP_ENV)
    if group is None:
        return  # not under a stage that armed the switch (a library call in a test): never kill an unknown group
    # Straight to the real stderr: lines still in the native-log filter's pipe die with the process.
    os.write(native_logs.real_stderr_fd(), f"crash point {wanted}: killing the stage (process group {group})\n".encode())
    for pgid in dict.fromkeys((int(group), os.getpgrp())):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
