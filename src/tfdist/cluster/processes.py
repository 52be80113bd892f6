"""A group of local task processes that live and die together.

Each task runs in its own session (so a terminal's Ctrl-C reaches only the
launcher, which stops the tasks in order) and with a parent-death signal (so
even a ``kill -9`` of the launcher takes its tasks along). Their output is
relayed line by line, prefixed with the task's name. A SIGTERM is a
scheduler's notice: passed on to the tasks that train, which back up and exit
75, and so does the group (:class:`~tfdist.errors.Preempted`).
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from tfdist import native_logs
from tfdist.cluster.preemption import PEERS_BACKING_UP, Notice, where_backed_up
from tfdist.errors import PREEMPTED_EXIT, Interrupted, Preempted, RunError, TaskFailed
from tfdist.hardware import usable_cpus

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


@dataclass
class _Task:
    name: str
    process: subprocess.Popen
    must_finish: bool
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=12))
    reader: threading.Thread | None = None


class ProcessGroup:
    """Local task processes that live and die together.

    Each task runs in its own session (so a terminal's Ctrl-C reaches only the
    launcher, which stops the tasks in order) and with a parent-death signal (so
    even a ``kill -9`` of the launcher takes its tasks along). Use it as a
    context manager: leaving the block, normally or by an exception, stops every
    task still running. Inside it, SIGINT raises :class:`Interrupted`; a first
    SIGTERM while tasks that must finish run is passed on to them (a
    preemption's notice: they back up and exit 75, and :meth:`wait` raises
    :class:`Preempted`), a second one raises :class:`Interrupted`.

    Args:
        out: where task output goes, each line prefixed with ``[task-name]``.
        stop_timeout: seconds a task gets between SIGTERM and SIGKILL.
        failure_grace: seconds the main thread gets to react to a failed task
            (see :meth:`watch`) before the process exits on its own.
    """

    def __init__(self, out: IO[str] | None = None, stop_timeout: float = 5.0, failure_grace: float = 20.0):
        self.out = out or sys.stderr
        self.stop_timeout = stop_timeout
        self.failure_grace = failure_grace
        self.tasks: list[_Task] = []
        self.failure: str | None = None
        self._write_lock = threading.Lock()
        self._fail_lock = threading.Lock()
        self._stop_watching = threading.Event()
        self._previous_handlers: dict[int, Any] = {}
        self.notice = Notice()
        self.preempted: _Task | None = None
        self.stopped = False

    def __enter__(self) -> ProcessGroup:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: Any) -> None:
        self._stop_watching.set()
        if error is not None and not self.failure:
            time.sleep(0.5)  # a task's death often reaches this process first as an error of its own
            self.poll()
        try:
            self.stop()
        finally:
            for signum, handler in self._previous_handlers.items():
                signal.signal(signum, handler)
        if self.failure and error is not None and (isinstance(error, TaskFailed) or str(error) != self.failure):
            raise RunError(self.failure) from None

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGUSR1:
            if self.failure:
                raise TaskFailed(self.failure)
            return
        self.notice.take(signum, self._pass_on)

    def _pass_on(self) -> list[str]:
        training = self._training()
        for task in training:
            _signal_group(task.process, signal.SIGTERM)
        return [task.name for task in training]

    def _training(self) -> list[_Task]:
        return [task for task in self.tasks if task.must_finish and task.process.poll() is None]

    def start(self, name: str, command: Sequence[str], env: Mapping[str, str], must_finish: bool = True,
              cpus: set[int] | None = None) -> int:
        """Start task ``name``; return its pid.

        Args:
            command: the program and its arguments.
            env: variables added to this process's environment (e.g. TF_CONFIG).
            must_finish: True for a task that ends on its own with exit 0 (a
                worker); False for a server the group stops when done (a ps).
            cpus: the CPUs the task may run on (None: any the launcher may use).
        """
        process = subprocess.Popen(
            list(command),
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(cpus),
        )
        task = _Task(name, process, must_finish)
        task.reader = threading.Thread(target=self._relay, args=(task,), name=f"relay-{name}", daemon=True)
        task.reader.start()
        self.tasks.append(task)
        log.info("started %s (pid %d%s)", name, process.pid,
                 f", on CPU {', '.join(map(str, sorted(cpus)))}" if cpus else "")
        return process.pid

    def _relay(self, task: _Task) -> None:
        assert task.process.stdout is not None
        for raw in task.process.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip()
            task.tail.append(line)
            with self._write_lock:
                self.out.write(f"[{task.name}] {line}\n")
                self.out.flush()

    def poll(self) -> bool:
        """Record the failed task; True when every must-finish task ended with 0.

        A failure is a task that exited non-zero, or a server that exited at all.
        Where several have ended, one killed by a signal is named: its peers exit
        1 only because they lost it (a worker notices a killed peer within
        milliseconds, often before this poll does). A task that must finish and
        exited 75 backed up when preempted (:attr:`preempted`): its peers'
        exits are no failure then.
        """
        done, failed = True, []
        for task in self.tasks:
            code = task.process.poll()
            if code is None:
                done = done and not task.must_finish
            elif code == PREEMPTED_EXIT and task.must_finish:
                self.preempted = self.preempted or task
            elif code != 0 or not task.must_finish:
                failed.append((code, task))
        if self.preempted:
            return False
        if failed:
            code, task = min(failed, key=lambda pair: pair[0] >= 0)  # killed (code < 0) first, then task order
            if self.notice.stopped(code):
                self.stopped = True
                return False
            self._fail(task, code)
            return False
        return done

    def wait(self, interval: float = 0.2) -> None:
        """Block until every must-finish task ended with exit 0.

        Raises:
            RunError: a task failed; the others are stopped first, and the
                message names the task, how it ended and its last output.
        """
        while not self.poll():
            if self.preempted:
                self._end_preempted(self.preempted)
            if self.stopped:
                self.stop()
                raise Interrupted(signal.SIGTERM, "every task was stopped")
            if self.failure:
                self.stop()
                raise RunError(self.failure)
            self.notice.check()
            time.sleep(interval)

    def _end_preempted(self, task: _Task) -> None:
        """``task`` backed up and exited 75: its peers get a few seconds to do the same, then the group stops."""
        deadline = time.monotonic() + PEERS_BACKING_UP
        while self._training() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.stop()
        raise Preempted(where_backed_up(task.tail, task.name))

    def watch(self, interval: float = 0.5) -> None:
        """Watch the tasks from a thread while the main thread does other work.

        On a failure, the main thread gets :class:`RunError` (raised there as
        :class:`TaskFailed`, through SIGUSR1, so a blocking wait is interrupted too
        and no ``except Exception`` swallows it); if it has not left the group
        ``failure_grace`` seconds later, the tasks are stopped and the process
        exits 1 with the message.
        """
        main = threading.main_thread().ident
        assert main is not None, "the main thread has started"

        def run() -> None:
            while not self._stop_watching.wait(interval):
                self.poll()
                if self.failure:
                    signal.pthread_kill(main, signal.SIGUSR1)
                    if not self._stop_watching.wait(self.failure_grace):
                        self.stop()
                        sys.stderr.write(f"error: {self.failure}\n")
                        native_logs.exit_now(1)
                    return

        threading.Thread(target=run, name="watch-tasks", daemon=True).start()

    def _fail(self, task: _Task, code: int) -> None:
        with self._fail_lock:
            if self.failure:
                return
            self.failure = self._describe(task, code)

    def _describe(self, task: _Task, code: int) -> str:
        if task.reader is not None:
            task.reader.join(timeout=2)
        if code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        elif task.must_finish:
            how = f"exited with code {code}"
        else:
            how = f"stopped unexpectedly (exit code {code})"
        lines = [line for line in task.tail if line.strip()][-8:]
        output = "\n".join(f"  [{task.name}] {line}" for line in lines) if lines else "  (no output)"
        return f"task {task.name} (pid {task.process.pid}) {how}; the other tasks were stopped. Its last output:\n{output}"

    def stop(self) -> None:
        """Stop the tasks in start order: SIGTERM, then SIGKILL after ``stop_timeout``.

        One at a time, first task first: under MultiWorkerMirrored the chief
        (started first) can only finish its step, close its MLflow run and exit
        while its peers are still there to complete the all-reduce.
        """
        for task in self.tasks:
            if task.process.poll() is not None:
                continue
            _signal_group(task.process, signal.SIGTERM)
            try:
                task.process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                _signal_group(task.process, signal.SIGKILL)
                task.process.wait()
        for task in self.tasks:
            _signal_group(task.process, signal.SIGKILL)  # anything the task itself started
            if task.reader is not None:
                task.reader.join(timeout=2)


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def die_with_parent(cpus: set[int] | None = None) -> Any:
    """A preexec_fn asking Linux to SIGKILL the child when the launcher dies, and to keep it on ``cpus`` (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return preexec


def task_cpus(count: int) -> list[set[int]]:
    """A CPU each for ``count`` tasks, round-robin over the CPUs this process may use."""
    available = usable_cpus()
    return [{available[i % len(available)]} for i in range(count)]
