"""A launcher's side of a preemption: its SIGTERM passed on to the tasks that train, their exit 75 read back.

A scheduler's SIGTERM to a launcher (the local one, Ray's, a repeat's parent
stage) is the notice the tasks need: they agree on a step, back up and exit 75
(:mod:`tfdist.resume.within_epoch`), and the launcher exits 75 with them. A
second SIGTERM, or the tasks not done within :data:`PREEMPTED_TASKS_BOUND`,
stops them all at once. No TensorFlow here.
"""

from __future__ import annotations

import logging
import re
import signal
import time
from collections.abc import Callable, Iterable

from tfdist.errors import PREEMPTION_BOUND, Interrupted

log = logging.getLogger(__name__)

#: Seconds the tasks get, from a SIGTERM passed on, to back up and exit: theirs and a start-up's or an exit's more.
PREEMPTED_TASKS_BOUND = PREEMPTION_BOUND + 10
#: Seconds the other tasks that train get to back up and exit once one exited preempted.
PEERS_BACKING_UP = 10.0
_WHERE = re.compile(r"preempted \(SIGTERM\): (.+?); run the same command again")


def where_backed_up(lines: Iterable[str], task: str) -> str:
    """Where a preempted task says it backed up, from its output (its last word on it), else that it did."""
    found = [match[1] for line in lines if (match := _WHERE.search(line))]
    return found[-1] if found else f"{task} backed up"


class Notice:
    """A launcher's SIGTERMs: the first while tasks train is passed on to them (:meth:`take`), a second one, or the
    tasks still running :data:`PREEMPTED_TASKS_BOUND` seconds later (:meth:`check`), ends with Interrupted."""

    def __init__(self) -> None:
        self.since: float | None = None

    def take(self, signum: int, pass_on: Callable[[], list[str]]) -> None:
        """Take signal ``signum``: a first SIGTERM goes to the tasks ``pass_on`` reaches (it names them); any other
        signal, or none reached, raises Interrupted."""
        if signum == signal.SIGTERM and self.since is None:
            reached = pass_on()
            if reached:
                self.since = time.monotonic()
                log.warning("SIGTERM: passed on to %s to back up (within %d s); a second SIGTERM stops every task now",
                            ", ".join(reached), PREEMPTED_TASKS_BOUND)
                return
        raise Interrupted(signum, "every task was stopped")

    def stopped(self, code: int) -> bool:
        """Whether a task that ended with ``code`` was stopped by the SIGTERM passed on before it trained (no backup
        of its own to make yet): the launcher is then stopped, as asked, not failed."""
        return self.since is not None and code in (-signal.SIGTERM, 128 + signal.SIGTERM)

    def check(self) -> None:
        """Raise Interrupted once the tasks had their time to back up."""
        if self.since is not None and time.monotonic() - self.since > PREEMPTED_TASKS_BOUND:
            raise Interrupted(signal.SIGTERM, f"the tasks did not back up within {PREEMPTED_TASKS_BOUND} s of it; "
                              "every task was stopped")
