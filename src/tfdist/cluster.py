"""TF_CONFIG and local clusters of processes: the only module that touches either.

The strategies whose replicas live in several processes (MultiWorkerMirrored,
ParameterServer) run in one of two modes:

* **cluster mode**: ``TF_CONFIG`` is set, as Kubeflow's TFJob, Ray Train or a
  person sets it. This process is the task it names; :func:`read_tf_config`
  parses and checks it, :func:`check_cluster` checks it fits the strategy.
* **local mode**: no ``TF_CONFIG``. :func:`local_cluster` picks free ports on
  127.0.0.1 and :class:`ProcessGroup` starts one process per task with its own
  ``TF_CONFIG``, prefixes their output with the task name, and stops every one
  of them when one fails or when it is itself interrupted.
"""

from __future__ import annotations

import collections
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from tfdist.errors import InputError, Interrupted, RunError

log = logging.getLogger(__name__)

TF_CONFIG = "TF_CONFIG"
#: Where non-chief workers save what they must write somewhere (set by the local launcher).
SCRATCH_ENV = "TFDIST_SCRATCH_DIR"
#: How many times the local launcher has restarted this stage by executing itself anew.
RESTART_ENV = "TFDIST_RESTART"
LOOPBACK = "127.0.0.1"
_JOBS = ("chief", "worker", "ps", "evaluator")
_PR_SET_PDEATHSIG = 1


class ClusterError(InputError):
    """A malformed TF_CONFIG, or a cluster that does not fit the strategy (exit 2)."""


@dataclass(frozen=True)
class ClusterTask:
    """One task of a cluster: the cluster spec and which task this process is.

    Attributes:
        cluster: job name -> list of ``host:port``, as in TF_CONFIG.
        task_type: ``chief``, ``worker`` or ``ps``.
        task_index: index within its job.
    """

    cluster: Mapping[str, list[str]]
    task_type: str
    task_index: int

    @property
    def name(self) -> str:
        """``worker-1``: how logs and errors name the task."""
        return f"{self.task_type}-{self.task_index}"

    @property
    def is_chief(self) -> bool:
        """The task that writes outputs and logs to MLflow: ``chief``, else worker 0."""
        if "chief" in self.cluster:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    def count(self, job: str) -> int:
        return len(self.cluster.get(job, []))

    def to_tf_config(self) -> str:
        return json.dumps({"cluster": dict(self.cluster), "task": {"type": self.task_type, "index": self.task_index}})

    def resolver(self) -> Any:
        """A TensorFlow cluster resolver for this task (imports TensorFlow)."""
        import tensorflow as tf

        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(dict(self.cluster)), task_type=self.task_type, task_id=self.task_index,
            rpc_layer="grpc",
        )


def parse_tf_config(text: str, source: str = TF_CONFIG) -> ClusterTask:
    """Parse and check a TF_CONFIG JSON document.

    Raises:
        ClusterError: naming what is wrong and where (``source``).
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ClusterError(f"{source} is not valid JSON ({err.msg} at character {err.pos})") from None
    if not isinstance(doc, dict):
        raise ClusterError(f"{source} must be a JSON object with 'cluster' and 'task', got {type(doc).__name__}")
    cluster, task = doc.get("cluster"), doc.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterError(f"{source}: 'cluster' must map job names to lists of host:port, got {cluster!r}")
    for job, addresses in cluster.items():
        if job not in _JOBS:
            raise ClusterError(f"{source}: unknown job {job!r} in 'cluster'; jobs are {', '.join(_JOBS)}")
        if not isinstance(addresses, list) or not addresses:
            raise ClusterError(f"{source}: cluster.{job} must be a non-empty list of host:port, got {addresses!r}")
        for address in addresses:
            _check_address(source, job, address)
    if not isinstance(task, dict):
        raise ClusterError(f"{source}: 'task' must be an object like {{\"type\": \"worker\", \"index\": 0}}, got {task!r}")
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type not in cluster:
        raise ClusterError(f"{source}: task.type {task_type!r} is not a job of the cluster ({', '.join(cluster)})")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cluster[task_type]):
        raise ClusterError(
            f"{source}: task.index {index!r} is out of range for job {task_type!r} "
            f"({len(cluster[task_type])} task(s): 0..{len(cluster[task_type]) - 1})"
        )
    return ClusterTask({job: list(addrs) for job, addrs in cluster.items()}, task_type, index)


def _check_address(source: str, job: str, address: Any) -> None:
    host, sep, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"{source}: cluster.{job} address {address!r} must look like host:port, e.g. worker-0:2222")


def read_tf_config(environ: Mapping[str, str] | None = None) -> ClusterTask | None:
    """The task TF_CONFIG names, or None when it is unset or blank (local mode)."""
    text = (os.environ if environ is None else environ).get(TF_CONFIG, "")
    return parse_tf_config(text) if text.strip() else None


def check_cluster(task: ClusterTask, strategy: str) -> None:
    """Refuse a cluster the strategy cannot run on, naming the job that is wrong.

    multi_worker_mirrored needs workers (and at most one chief), no ps;
    parameter_server needs one chief (the coordinator), workers and ps.
    """
    jobs = set(task.cluster)
    if "evaluator" in jobs:
        raise ClusterError(f"{TF_CONFIG}: job 'evaluator' is not supported; the evaluate stage evaluates the model")
    if task.count("chief") > 1:
        raise ClusterError(f"{TF_CONFIG}: cluster.chief must list one task, got {task.count('chief')}")
    if strategy == "multi_worker_mirrored":
        if "ps" in jobs:
            raise ClusterError(f"{TF_CONFIG}: multi_worker_mirrored takes no 'ps' job; use parameter_server or drop cluster.ps")
        if "worker" not in jobs and "chief" not in jobs:
            raise ClusterError(f"{TF_CONFIG}: multi_worker_mirrored needs a 'worker' job")
    elif strategy == "parameter_server":
        missing = [job for job in ("chief", "worker", "ps") if job not in jobs]
        if missing:
            raise ClusterError(
                f"{TF_CONFIG}: parameter_server needs jobs chief, worker and ps; missing {', '.join(missing)}"
            )


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports free on ``host`` right now (held open until all are chosen)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def local_cluster(strategy: str, workers: int, ps: int) -> dict[str, list[str]]:
    """A cluster spec on free loopback ports for ``strategy`` (never 0.0.0.0 in the spec).

    multi_worker_mirrored: ``workers`` workers, worker 0 acting as chief.
    parameter_server: a chief (the coordinator: this process), ``workers`` workers and ``ps`` ps.
    """
    jobs = {"worker": workers} if strategy == "multi_worker_mirrored" else {"chief": 1, "worker": workers, "ps": ps}
    ports = iter(free_ports(sum(jobs.values())))
    return {job: [f"{LOOPBACK}:{next(ports)}" for _ in range(n)] for job, n in jobs.items()}


def tasks_of(cluster: Mapping[str, list[str]]) -> list[ClusterTask]:
    """Every task of ``cluster``, chief first, then workers, then ps."""
    order = sorted(cluster, key=_JOBS.index)
    return [ClusterTask(cluster, job, i) for job in order for i in range(len(cluster[job]))]


def serve(task: ClusterTask) -> None:
    """Run this process as a parameter_server worker or ps: serve until killed.

    The chief sends these tasks their work; they never finish on their own (a
    TFJob ends when its chief succeeds; the local launcher stops them).
    """
    import tensorflow as tf

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # nothing to save: die at once when stopped
    resolver = task.resolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=task.task_type, task_index=task.task_index, protocol="grpc", start=True
    )
    log.info("%s serving on %s for the chief", task.name, task.cluster[task.task_type][task.task_index])
    server.join()


def disconnect_remote() -> None:
    """Drop this process's connection to remote tasks before they are stopped.

    Without it, TensorFlow tries to delete its functions on the (stopped)
    workers at interpreter exit and prints dozens of gRPC errors.
    """
    import gc

    from tensorflow.python.eager import context

    gc.collect()
    context._reset_context()


def restarts_done(environ: Mapping[str, str] | None = None) -> int:
    """Restarts already made by :func:`restart_self` (0 for a stage started normally)."""
    value = (os.environ if environ is None else environ).get(RESTART_ENV, "0")
    return int(value) if value.isdigit() else 0


def restart_self(command: Sequence[str], restart: int) -> None:
    """Replace this process by a fresh run of ``command`` (same pid, so DVC keeps waiting on it).

    For a local parameter_server stage, whose TensorFlow runtime stays bound to
    the cluster it coordinated: only a new process can start a new cluster.
    Never returns.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if sys.stderr.fileno() != 2:  # native stderr was muted (mute_native_stderr): give it back
        os.dup2(sys.stderr.fileno(), 2)
    os.environ[RESTART_ENV] = str(restart)
    os.execv(command[0], list(command))


def mute_native_stderr() -> None:
    """Silence what native code writes to stderr; Python's ``sys.stderr`` still prints.

    For a coordinator whose remote tasks are gone: as the failed run unwinds,
    TensorFlow deletes its functions on the (dead) workers and its C++ logging
    prints dozens of gRPC errors, burying the one-line error that says what
    happened. Python's stderr moves to a copy of the terminal's descriptor, so
    that line (and Python logging) still reach the user.
    """
    sys.stderr.flush()
    python_stderr = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    for handler in logging.root.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
            handler.setStream(python_stderr)
    sys.stderr = python_stderr
    logging.getLogger("tensorflow").setLevel(logging.CRITICAL)  # its follow-up errors, same story


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
    task still running. Inside it, SIGTERM raises :class:`Interrupted`.

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
        if self.failure and error is not None and str(error) != self.failure:
            raise RunError(self.failure) from None

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGUSR1 and self.failure:
            raise RunError(self.failure)
        if signum != signal.SIGUSR1:
            raise Interrupted(signum, "every task was stopped")

    def start(self, name: str, command: Sequence[str], env: Mapping[str, str], must_finish: bool = True) -> int:
        """Start task ``name``; return its pid.

        Args:
            command: the program and its arguments.
            env: variables added to this process's environment (e.g. TF_CONFIG).
            must_finish: True for a task that ends on its own with exit 0 (a
                worker); False for a server the group stops when done (a ps).
        """
        process = subprocess.Popen(
            list(command),
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent(),
        )
        task = _Task(name, process, must_finish)
        task.reader = threading.Thread(target=self._relay, args=(task,), name=f"relay-{name}", daemon=True)
        task.reader.start()
        self.tasks.append(task)
        log.info("started %s (pid %d)", name, process.pid)
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
        """Record the first failed task; True when every must-finish task ended with 0.

        A failure is a task that exited non-zero, or a server that exited at all.
        """
        done = True
        for task in self.tasks:
            code = task.process.poll()
            if code is None:
                done = done and not task.must_finish
            elif code != 0 or not task.must_finish:
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
            if self.failure:
                self.stop()
                raise RunError(self.failure)
            time.sleep(interval)

    def watch(self, interval: float = 0.5) -> None:
        """Watch the tasks from a thread while the main thread does other work.

        On a failure, the main thread gets :class:`RunError` (through SIGUSR1, so
        a blocking wait is interrupted too); if it has not left the group
        ``failure_grace`` seconds later, the tasks are stopped and the process
        exits 1 with the message.
        """
        main = threading.main_thread().ident

        def run() -> None:
            while not self._stop_watching.wait(interval):
                self.poll()
                if self.failure:
                    signal.pthread_kill(main, signal.SIGUSR1)
                    if not self._stop_watching.wait(self.failure_grace):
                        self.stop()
                        sys.stderr.write(f"error: {self.failure}\n")
                        sys.stderr.flush()
                        os._exit(1)
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


def _die_with_parent() -> Any:
    """A preexec_fn asking Linux to SIGKILL the child when the launcher dies (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return preexec
