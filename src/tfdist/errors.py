"""The kinds of failure a stage reports, and the exit code each maps to.

Stages print the message of these as one line and exit with ``exit_code``;
any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import signal


class TfdistError(Exception):
    """Base of the errors a user should read as one line, not a traceback."""

    exit_code = 1
    #: End the process right after the one line, without the interpreter's teardown.
    exit_at_once = False


class InputError(TfdistError):
    """Something the user gave is wrong: a file, a value, a path (exit 2)."""

    exit_code = 2


class StrategyError(InputError):
    """An unknown strategy name, a combination of params it cannot train, or hardware it needs and this machine lacks (exit 2)."""


class RunError(TfdistError):
    """Something failed while running: a worker died, training diverged (exit 1)."""

    exit_code = 1


class DiskFull(RunError):
    """A disk filled while an output was written (exit 1): the path, the bytes, and that the outputs are as they were."""


class PeerLost(RunError):
    """Another task of this process's cluster was lost while training (exit 1).

    The stage exits at once after saying so: TensorFlow's teardown would try to
    reach the lost task again, printing a gRPC error per remote function.
    """

    exit_at_once = True


class TaskFailed(BaseException):
    """A task of this process's local cluster failed while the main thread worked (exit 1).

    Raised in the main thread from the signal the group's watcher sends
    (:meth:`tfdist.cluster.processes.ProcessGroup.watch`), wherever that thread
    is; a ``BaseException``, as :class:`Interrupted` is, so that an ``except
    Exception`` there (logging's ``Handler.emit``, TensorFlow's coordinator)
    cannot swallow it and leave the chief working on, unaware, for the watcher's
    grace. The group turns it into :class:`RunError` as it is left.
    """

    exit_code = 1
    exit_at_once = False


class Interrupted(BaseException):
    """The process got SIGINT or SIGTERM and stopped (exit 128 + the signal number).

    A ``BaseException``, as ``KeyboardInterrupt`` is: the SIGTERM handler raises
    it wherever the process happens to be, and an ``except Exception`` there
    must not swallow it. logging's ``Handler.emit`` did: a SIGTERM that landed
    while a worker logged "waiting for worker-1" was printed as a logging error,
    and the worker went on waiting (one loaded run in three).
    """

    exit_at_once = False

    def __init__(self, signum: int, what: str = ""):
        super().__init__(f"interrupted by {signal.Signals(signum).name}" + (f"; {what}" if what else ""))
        self.exit_code = 128 + signum


#: Seconds from a SIGTERM to the backup it asks for, at most; past them the stage ends at once, with what the last
#: backup holds. Kubernetes gives a pod 30 s by default (terminationGracePeriodSeconds), a cloud spot machine about
#: as much: this leaves the rest for closing the MLflow run and exiting.
PREEMPTION_BOUND = 20
#: A preempted stage's exit code: ``EX_TEMPFAIL`` (sysexits.h).
PREEMPTED_EXIT = 75


class Preempted(Interrupted):
    """The process took SIGTERM as a scheduler's notice, backed its training up and stopped (exit 75).

    The run ends KILLED and tagged ``tfdist.preempted``; the same command again
    goes on from the step backed up. 75 is ``EX_TEMPFAIL`` (sysexits.h): a
    failure to retry, which Slurm's ``--requeue`` and Kubernetes' restart
    policy do.
    """

    def __init__(self, where: str):
        BaseException.__init__(self, f"preempted (SIGTERM): {where}; run the same command again to go on from there")
        self.where = where
        self.exit_code = PREEMPTED_EXIT
