"""The local launcher: a multi-process strategy's cluster as processes on 127.0.0.1.

Without ``TF_CONFIG`` the train stage starts its own cluster: it picks free
loopback ports, starts one copy of itself per task (each with its own
``TF_CONFIG``) in a :class:`~tfdist.cluster.processes.ProcessGroup`, and waits
for the tasks that train (every worker; a coordinated strategy's chief) to
finish. When a task dies, every task is stopped and the whole group starts
again, up to ``distributed.max_restarts`` times; training resumes from the last
backed-up epoch. No TensorFlow here: the launcher only waits, and starts in a blink.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from tfdist.cluster import private_network
from tfdist.cluster.ports import LOOPBACK, free_ports, profiler_ports, release_ports
from tfdist.cluster.processes import ProcessGroup, task_cpus
from tfdist.config.knobs import DistributedConfig
from tfdist.distribute.cluster_spec import TF_CONFIG, ClusterTask, describe_cluster, tasks_of
from tfdist.distribute.registry import StrategySpec
from tfdist.errors import Interrupted, RunError

log = logging.getLogger(__name__)

#: Where non-chief workers save what they must write somewhere (set by the local launcher).
SCRATCH_ENV = "TFDIST_SCRATCH_DIR"
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


def launch_local(spec: StrategySpec, distributed: DistributedConfig, command: Sequence[str],
                 on_stop: Callable[[str], None], outside: Sequence[str] = ()) -> None:
    """Run ``spec``'s cluster as local processes, restarting it after a failure per ``distributed.max_restarts``.

    Args:
        spec: a multi-process strategy.
        distributed: worker and ps counts, and the restart limit.
        command: the stage command that runs as one task of the cluster.
        on_stop: told ``FAILED`` or ``KILLED`` when an attempt ends early, to
            close whatever the stopped chief left open (its MLflow run).
        outside: URIs the cluster must reach beyond itself (the tracking store, an S3 endpoint): under
            ``distributed.task_network: private`` they are relayed into its private network, or keep it out.

    Raises:
        RunError: a task failed and no restart is left.
        Interrupted: this process got SIGINT or SIGTERM (never restarted).
    """
    exposed = _enter_private_network(distributed, command, outside)
    restarting(lambda: _attempt(spec, distributed, command, on_stop, exposed), distributed.max_restarts)


class NoRoom(RunError):
    """The cluster has no room for the tasks: restarting would only wait for it again."""


def restarting(attempt: Callable[[], T], limit: int) -> T:
    """Run ``attempt`` again after each RunError, ``limit`` times in all, then give up.

    Interrupted is a BaseException, not a RunError: a stopped launcher never restarts; nor is
    :class:`NoRoom` retried.
    """
    restart = 0
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


def _attempt(spec: StrategySpec, distributed: DistributedConfig, command: Sequence[str],
             on_stop: Callable[[str], None], exposed: str | None = None) -> None:
    """One attempt: start the tasks, wait for those that train, stop them all (``exposed``: why they are on the
    machine's network)."""
    cluster = local_cluster(spec, distributed)
    log.info("local mode: starting %s on loopback for %s", describe_cluster(cluster), spec.name)
    if exposed is not None:
        warn_open_ports(cluster, exposed)
    with tempfile.TemporaryDirectory(prefix="tfdist-scratch-") as scratch, _holding(cluster_ports(cluster)):
        try:
            with ProcessGroup() as group:
                tasks = tasks_of(cluster)
                cpus = _pinned(spec, distributed, tasks)
                for task in tasks:
                    env = {TF_CONFIG: task.to_tf_config(), SCRATCH_ENV: scratch}
                    # Tasks that train end on their own; the servers of a coordinated run are stopped once its chief is done.
                    trains = task.task_type == "chief" or not spec.coordinated
                    group.start(task.name, command, env, must_finish=trains, cpus=cpus.get(task.name))
                group.wait()
                log.info("training finished in %s; the chief wrote the outputs", describe_cluster(cluster))
        except BaseException as err:
            on_stop("KILLED" if isinstance(err, Interrupted) else "FAILED")
            raise


def _pinned(spec: StrategySpec, distributed: DistributedConfig, tasks: Sequence[ClusterTask]) -> dict[str, set[int]]:
    """The CPU each worker runs on, under ``distributed.pin_tasks`` (task name -> CPUs), round-robin.

    Each worker then has a core of its own, as on a machine of its own: a
    synchronous cluster's every task (multi_worker_mirrored), a coordinated
    one's workers (parameter_server). Its ps tasks, which serve every worker,
    and its chief, which dispatches the steps, keep every CPU: pinned, a worker's step
    measured faster in every alternated round (docs/performance/parallelism.md, 8c).
    """
    if not distributed.pin_tasks:
        return {}
    pinned = [task for task in tasks if task.task_type == "worker" or not spec.coordinated]
    return dict(zip((task.name for task in pinned), task_cpus(len(pinned)), strict=True))


@contextlib.contextmanager
def _holding(ports: Sequence[int]) -> Iterator[None]:
    """Hold ``ports`` in the port book for the block (they are already booked by :func:`free_ports`)."""
    try:
        yield
    finally:
        release_ports(ports)
