"""The local launcher: a multi-process strategy's cluster as processes on 127.0.0.1.

Without ``TF_CONFIG`` the train stage starts its own cluster: it picks free
loopback ports, starts one copy of itself per task (each with its own
``TF_CONFIG``) in a :class:`~tfdist.cluster.processes.ProcessGroup`, and either
waits for the workers to finish (they train) or coordinates training itself
(parameter_server's chief). When a task dies, every task is stopped and the
whole group starts again, up to ``distributed.max_restarts`` times; training
resumes from the last backed-up epoch. No TensorFlow here: a launcher that
only waits must start in a blink.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from tfdist import native_logs
from tfdist.cluster import private_network
from tfdist.cluster.ports import LOOPBACK, free_ports, profiler_ports, release_ports
from tfdist.cluster.processes import ProcessGroup, task_cpus
from tfdist.config import DistributedConfig
from tfdist.distribute.cluster_spec import TF_CONFIG, ClusterTask, tasks_of
from tfdist.distribute.registry import StrategySpec
from tfdist.errors import Interrupted, RunError

log = logging.getLogger(__name__)

#: Where non-chief workers save what they must write somewhere (set by the local launcher).
SCRATCH_ENV = "TFDIST_SCRATCH_DIR"
#: How many times the local launcher has restarted this stage by executing itself anew.
RESTART_ENV = "TFDIST_RESTART"

T = TypeVar("T")


def cluster_ports(cluster: Mapping[str, list[str]]) -> list[int]:
    """The ports of a cluster spec's addresses."""
    return [int(address.rsplit(":", 1)[1]) for addresses in cluster.values() for address in addresses]


def local_cluster(spec: StrategySpec, distributed: DistributedConfig) -> dict[str, list[str]]:
    """A cluster spec on free loopback ports, laid out by the strategy's record.

    TensorFlow's servers bind every interface whatever the spec says: :mod:`private_network` keeps them off the
    network.

    Each job has ``distributed.workers`` or ``distributed.ps`` tasks, or one
    (:meth:`~tfdist.distribute.registry.StrategySpec.task_counts`).
    Its ports are held in the port book until :func:`release_ports`, and are none of those its tasks will serve
    TensorFlow's profiler on (:data:`~tfdist.cluster.ports.PROFILER_PORT_ENV`).
    """
    sizes = spec.task_counts(distributed.workers, distributed.ps)
    tasks = sum(sizes.values())
    ports = iter(free_ports(tasks, avoid=profiler_ports(tasks)))
    return {job: [f"{LOOPBACK}:{next(ports)}" for _ in range(n)] for job, n in sizes.items()}


def describe_cluster(cluster: Mapping[str, list[str]]) -> str:
    """``2 workers, 1 ps``: a cluster in words, for logs."""
    return ", ".join(f"{len(addrs)} {job}{'s' if job == 'worker' and len(addrs) > 1 else ''}" for job, addrs in cluster.items())


def launch_local(
    spec: StrategySpec, distributed: DistributedConfig, command: Sequence[str],
    coordinate: Callable[[ClusterTask], T], on_stop: Callable[[str], None], outside: Sequence[str] = (),
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
        outside: URIs the cluster must reach beyond itself (the tracking store, an S3 endpoint): under
            ``distributed.task_network: private`` they are relayed into its private network, or keep it out.

    Returns:
        What ``coordinate`` returned, or None when worker processes trained
        (their chief wrote the outputs).

    Raises:
        RunError: a task failed and no restart is left.
        Interrupted: this process got SIGINT or SIGTERM (never restarted).
    """
    exposed = _enter_private_network(distributed, command, outside)
    # A coordinating chief's TensorFlow runtime stays bound to the cluster it coordinated: only a new
    # process can start a new one.
    return restarting(lambda: _attempt(spec, distributed, command, coordinate, on_stop, exposed),
                      distributed.max_restarts,
                      restarts_done(), lambda restart: restart_self(command, restart) if spec.launcher_trains else None)


class NoRoom(RunError):
    """The cluster has no room for the tasks: restarting would only wait for it again."""


def restarting(attempt: Callable[[], T], limit: int, restart: int = 0,
               before_retry: Callable[[int], None] = lambda restart: None) -> T:
    """Run ``attempt`` again after each RunError, ``limit`` times in all (``restart`` already done), then give up.

    Interrupted is a BaseException, not a RunError: a stopped launcher never restarts; nor is
    :class:`NoRoom` retried.
    """
    while True:
        try:
            return attempt()
        except NoRoom:
            raise
        except RunError as err:
            if restart >= limit:
                raise RunError(f"{err}\n(gave up after {restart} restart(s): distributed.max_restarts is {limit})") from None
            restart += 1
            log.warning("%s\nrestarting every task (restart %d of %d); training resumes from the last backed-up epoch",
                        err, restart, limit)
            before_retry(restart)


def _enter_private_network(distributed: DistributedConfig, command: Sequence[str], outside: Sequence[str]) -> str | None:
    """None once this launcher runs in a private network (:mod:`private_network`; it may exec itself there), else why not."""
    if private_network.inside():
        private_network.settle_inside()
        return None
    if distributed.task_network == "host":
        return "distributed.task_network is host"
    addresses = private_network.outside_addresses(outside)
    reason = private_network.why_not_private(addresses)
    if reason is None:
        private_network.run_inside(command, addresses)
    return reason


def warn_open_ports(cluster: Mapping[str, list[str]], reason: str) -> None:
    """One line naming the task servers' ports the network reaches, and why they are not private."""
    log.warning("local mode: the task servers listen on every interface, without authentication, on ports %s: "
                "anyone who reaches this machine can run code in them while it trains (no private network: %s; "
                "docs/security.md)", ", ".join(map(str, cluster_ports(cluster))), reason)


def _attempt(
    spec: StrategySpec, distributed: DistributedConfig, command: Sequence[str],
    coordinate: Callable[[ClusterTask], T], on_stop: Callable[[str], None], exposed: str | None = None,
) -> T | None:
    """One attempt: start the tasks, train or wait, stop them all (``exposed``: why they are on the machine's network)."""
    cluster = local_cluster(spec, distributed)
    log.info("local mode: starting %s on loopback for %s", describe_cluster(cluster), spec.name)
    if exposed is not None:
        warn_open_ports(cluster, exposed)
    with tempfile.TemporaryDirectory(prefix="tfdist-scratch-") as scratch, _holding(cluster_ports(cluster)):
        try:
            with ProcessGroup() as group:
                started = [task for task in tasks_of(cluster) if not (task.task_type == "chief" and spec.launcher_trains)]
                cpus = _pinned(spec, distributed, started)
                for task in started:  # a chief that coordinates is this process
                    env = {TF_CONFIG: task.to_tf_config(), SCRATCH_ENV: scratch}
                    # Tasks that train end on their own; the servers of a coordinated run are stopped.
                    group.start(task.name, command, env, must_finish=not spec.launcher_trains, cpus=cpus.get(task.name))
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


def _pinned(spec: StrategySpec, distributed: DistributedConfig, tasks: Sequence[ClusterTask]) -> dict[str, set[int]]:
    """The CPU each worker runs on, under ``distributed.pin_tasks`` (task name -> CPUs), round-robin.

    Each worker then has a core of its own, as on a machine of its own: a
    synchronous cluster's every task (multi_worker_mirrored), a coordinated
    one's workers (parameter_server). Its ps tasks, which serve every worker,
    and its chief, this process, keep every CPU: pinned, a worker's step
    measured faster in every alternated round (docs/performance/parallelism.md, 8c).
    """
    if not distributed.pin_tasks:
        return {}
    pinned = [task for task in tasks if task.task_type == "worker" or not spec.launcher_trains]
    return dict(zip((task.name for task in pinned), task_cpus(len(pinned)), strict=True))


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
