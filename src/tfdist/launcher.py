"""The local launcher: a multi-process strategy's cluster as processes on 127.0.0.1.

Without ``TF_CONFIG`` the train stage starts its own cluster: it picks free
loopback ports, starts one copy of itself per task (each with its own
``TF_CONFIG``) in a :class:`~tfdist.process_group.ProcessGroup`, and either
waits for the workers to finish (they train) or coordinates training itself
(parameter_server's chief). When a task dies, every task is stopped and the
whole group starts again, up to ``distributed.max_restarts`` times; training
resumes from the last backed-up epoch. No TensorFlow here: a launcher that
only waits must start in a blink.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from tfdist import native_logs
from tfdist.cluster_spec import TF_CONFIG, ClusterTask, tasks_of
from tfdist.config import DistributedConfig
from tfdist.errors import Interrupted, RunError
from tfdist.process_group import ProcessGroup
from tfdist.strategies import StrategySpec

log = logging.getLogger(__name__)

#: Where non-chief workers save what they must write somewhere (set by the local launcher).
SCRATCH_ENV = "TFDIST_SCRATCH_DIR"
#: How many times the local launcher has restarted this stage by executing itself anew.
RESTART_ENV = "TFDIST_RESTART"
LOOPBACK = "127.0.0.1"

T = TypeVar("T")


#: The ports live local launchers hold, machine-wide (JSON, under flock): TMPDIR moves it.
PORT_BOOK = "tfdist-ports.json"
#: Probe sockets to try before giving up on finding unheld ports.
_PORT_TRIES = 200


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports free on ``host`` now and held by no other live tfdist launcher; held for this one.

    The kernel hands a probed port out again as soon as the probe closes, so
    two launches starting at once (``dvc queue start -j 2``) could be given
    the same port before either's tasks bind it. The port book records which
    ports each launcher process holds; a dead launcher's are free again.
    Release them with :func:`release_ports` when the cluster stops.

    Raises:
        RunError: no such ports after many tries (the ephemeral range is exhausted).
    """
    with _port_book() as book:
        for port in [port for port, pid in book.items() if not _alive(pid)]:
            del book[port]  # its launcher is gone
        held = {int(port) for port in book}
        chosen: list[int] = []
        sockets = []
        try:
            for _ in range(_PORT_TRIES):
                if len(chosen) == count:
                    break
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                try:
                    sock.bind((host, 0))
                except OSError:
                    break  # the kernel has no free port left in its range
                port = sock.getsockname()[1]
                if port not in held and port not in chosen:
                    chosen.append(port)
        finally:
            for sock in sockets:
                sock.close()
        if len(chosen) < count:
            raise RunError(f"no {count} free ports on {host} that another tfdist launch does not hold "
                           f"({len(held)} held); wait for it, or widen net.ipv4.ip_local_port_range")
        book.update({str(port): os.getpid() for port in chosen})
        return chosen


def release_ports(ports: Sequence[int]) -> None:
    """Give back ports :func:`free_ports` held for this process."""
    with _port_book() as book:
        for port in ports:
            if book.get(str(port)) == os.getpid():
                del book[str(port)]


@contextlib.contextmanager
def _port_book() -> Iterator[dict[str, int]]:
    """The port book as ``{port: launcher pid}``, read and written back under an exclusive lock."""
    path = Path(tempfile.gettempdir()) / PORT_BOOK
    with open(path, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            handle.seek(0)
            text = handle.read()
            try:
                book = {str(port): int(pid) for port, pid in json.loads(text).items()} if text.strip() else {}
            except (ValueError, AttributeError):
                book = {}  # a torn or foreign file: start a new book
            yield book
            handle.seek(0)
            handle.truncate()
            json.dump(book, handle)
            handle.flush()
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def cluster_ports(cluster: Mapping[str, list[str]]) -> list[int]:
    """The ports of a cluster spec's addresses."""
    return [int(address.rsplit(":", 1)[1]) for addresses in cluster.values() for address in addresses]


def local_cluster(spec: StrategySpec, distributed: DistributedConfig) -> dict[str, list[str]]:
    """A cluster spec on free loopback ports, laid out by the strategy's ``local_jobs`` (never 0.0.0.0).

    Each job has ``distributed.workers`` or ``distributed.ps`` tasks, or one.
    Its ports are held in the port book until :func:`release_ports`.
    """
    sizes = {job: 1 if count == "one" else getattr(distributed, count) for job, count in spec.local_jobs.items()}
    ports = iter(free_ports(sum(sizes.values())))
    return {job: [f"{LOOPBACK}:{next(ports)}" for _ in range(n)] for job, n in sizes.items()}


def describe_cluster(cluster: Mapping[str, list[str]]) -> str:
    """``2 workers, 1 ps``: a cluster in words, for logs."""
    return ", ".join(f"{len(addrs)} {job}{'s' if job == 'worker' and len(addrs) > 1 else ''}" for job, addrs in cluster.items())


def launch_local(
    spec: StrategySpec, distributed: DistributedConfig, command: Sequence[str],
    coordinate: Callable[[ClusterTask], T], on_stop: Callable[[str], None],
) -> T | None:
    """Run ``spec``'s cluster as local processes, restarting it after a failure per ``distributed.max_restarts``.

    Args:
        spec: a multi-process strategy.
        distributed: worker and ps counts, and the restart limit.
        command: the stage command that runs as one task of the cluster.
        coordinate: for a strategy whose launcher trains (``spec.launcher_trains``),
            trains in this process as the chief task and returns the result.
        on_stop: told ``FAILED`` or ``KILLED`` when an attempt ends early, to
            close whatever the stopped chief left open (its MLflow run).

    Returns:
        What ``coordinate`` returned, or None when worker processes trained
        (their chief wrote the outputs).

    Raises:
        RunError: a task failed and no restart is left.
        Interrupted: this process got SIGINT or SIGTERM (never restarted).
    """
    limit = distributed.max_restarts
    restart = restarts_done()
    while True:
        try:
            return _attempt(spec, distributed, command, coordinate, on_stop)
        except Interrupted:
            raise
        except RunError as err:
            if restart >= limit:
                raise RunError(f"{err}\n(gave up after {restart} restart(s): distributed.max_restarts is {limit})") from None
            restart += 1
            log.warning("%s\nrestarting every task (restart %d of %d); training resumes from the last backed-up epoch",
                        err, restart, limit)
            if spec.launcher_trains:
                # This process's TensorFlow runtime stays bound to the cluster it
                # coordinated: only a new process can start a new one.
                restart_self(command, restart)


def _attempt(
    spec: StrategySpec, distributed: DistributedConfig, command: Sequence[str],
    coordinate: Callable[[ClusterTask], T], on_stop: Callable[[str], None],
) -> T | None:
    """One attempt: start the tasks, train or wait, stop them all."""
    cluster = local_cluster(spec, distributed)
    log.info("local mode: starting %s on loopback for %s", describe_cluster(cluster), spec.name)
    with tempfile.TemporaryDirectory(prefix="tfdist-scratch-") as scratch, _holding(cluster_ports(cluster)):
        try:
            with ProcessGroup() as group:
                for task in tasks_of(cluster):
                    if task.task_type == "chief" and spec.launcher_trains:
                        continue  # this process coordinates
                    env = {TF_CONFIG: task.to_tf_config(), SCRATCH_ENV: scratch}
                    # Tasks that train end on their own; the servers of a coordinated run are stopped.
                    group.start(task.name, command, env, must_finish=not spec.launcher_trains)
                if not spec.launcher_trains:
                    group.wait()
                    log.info("all %d workers finished; the chief wrote the outputs", len(group.tasks))
                    return None
                group.watch()
                try:
                    return coordinate(ClusterTask(cluster, "chief", 0))
                except BaseException:
                    mute_native_stderr()
                    raise
        except BaseException as err:
            on_stop("KILLED" if isinstance(err, Interrupted) else "FAILED")
            raise


@contextlib.contextmanager
def _holding(ports: Sequence[int]) -> Iterator[None]:
    """Hold ``ports`` in the port book for the block (they are already booked by :func:`free_ports`)."""
    try:
        yield
    finally:
        release_ports(ports)


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
    sys.stderr.flush()
    if sys.stderr.fileno() != 2:  # native stderr was muted (mute_native_stderr): give it back
        os.dup2(sys.stderr.fileno(), 2)
    os.environ[RESTART_ENV] = str(restart)
    native_logs.exec_program(command[0], command)  # the new image starts its own filter


def mute_native_stderr() -> None:
    """Silence what native code writes to stderr; Python's ``sys.stderr`` still prints.

    For a coordinator whose remote tasks are gone: as the failed run unwinds,
    TensorFlow deletes its functions on the (dead) workers and its C++ logging
    prints dozens of gRPC errors, burying the one-line error that says what
    happened. Python's stderr moves to a copy of the terminal's descriptor, so
    that line (and Python logging) still reach the user.
    """
    sys.stderr.flush()
    python_stderr = os.fdopen(os.dup(native_logs.real_stderr_fd()), "w", buffering=1, encoding="utf-8",
                              errors="backslashreplace")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    for handler in logging.root.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
            handler.setStream(python_stderr)
    sys.stderr = python_stderr
    logging.getLogger("tensorflow").setLevel(logging.CRITICAL)  # its follow-up errors, same story
