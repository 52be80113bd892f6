"""Before a task joins its cluster, wait for its peers: bounded, interruptible, saying who is missing.

TensorFlow joins a cluster inside one C++ call that waits for every peer
forever, holding the interpreter: no message, no timeout, and no Python
signal handler runs (a worker whose peer never came waits without end and
ignores SIGTERM). So each task first waits here, in Python:
it listens on its own cluster address (so that its peers see it up) and
tries every peer's address until all accept a connection, naming the ones
it still awaits every few seconds, and gives up after
``distributed.connect_timeout`` seconds. Only then does TensorFlow take
over, with every peer known to be up.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tfdist.distribute.cluster_spec import ClusterTask
from tfdist.errors import RunError

log = logging.getLogger(__name__)

#: Seconds between two rounds of connection attempts, and between two "still waiting" lines.
PROBE_INTERVAL = 0.5
REPORT_INTERVAL = 5.0
#: Jobs that never join a cluster's collectives (an evaluator runs on its own).
_PASSIVE_JOBS = ("evaluator",)


def peers(task: ClusterTask) -> dict[str, str]:
    """Every other task of ``task``'s cluster: name -> ``host:port``."""
    return {f"{job}-{index}": address
            for job, addresses in task.cluster.items() if job not in _PASSIVE_JOBS
            for index, address in enumerate(addresses)
            if (job, index) != (task.task_type, task.task_index)}


def wait_for_peers(task: ClusterTask, timeout: float) -> float:
    """Wait until every peer of ``task`` accepts connections; the seconds it took.

    Raises:
        RunError: after ``timeout`` seconds, naming the tasks (and addresses) that never answered.
    """
    awaited = peers(task)
    started = last_report = time.monotonic()
    with _listening(task) as listener:
        while True:
            if listener is not None:
                _drain(listener)  # the peers' probes, so that the backlog never fills
            awaited = {name: address for name, address in awaited.items() if not _answers(address)}
            waited = time.monotonic() - started
            if not awaited:
                if waited >= REPORT_INTERVAL:
                    log.info("%s: every peer is up after %.0f s", task.name, waited)
                return waited
            if waited >= timeout:
                missing = ", ".join(f"{name} ({address})" for name, address in awaited.items())
                raise RunError(f"{task.name} gave up after {timeout:.0f} s waiting for {missing}: not started, or "
                               "unreachable from here; start it (check its address and firewall), or raise "
                               "distributed.connect_timeout")
            if time.monotonic() - last_report >= REPORT_INTERVAL:
                last_report = time.monotonic()
                log.info("%s: waiting for %s (%.0f s of distributed.connect_timeout %.0f s)", task.name,
                         ", ".join(f"{name} at {address}" for name, address in awaited.items()), waited, timeout)
            time.sleep(PROBE_INTERVAL)


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_INTERVAL):
            return True
    except (OSError, ValueError):  # refused, unreachable, a name that does not resolve (yet)
        return False


@contextmanager
def _listening(task: ClusterTask) -> Iterator[socket.socket | None]:
    """Accept connections on this task's own port while waiting, so that the peers see it up.

    TensorFlow's server takes the port over afterwards. A port already taken
    is left alone: something (this task's own server) already answers there.
    """
    host, _, port = task.cluster[task.task_type][task.task_index].rpartition(":")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        # Loopback stays loopback (a local cluster is never published); otherwise every interface, as TF's server.
        listener.bind((host if host in ("127.0.0.1", "localhost") else "", int(port)))
        listener.listen(64)
    except OSError:
        listener.close()
        yield None
        return
    listener.setblocking(False)
    try:
        yield listener
    finally:
        _drain(listener)
        listener.close()


def _drain(listener: socket.socket) -> None:
    """Close the connections peers' probes left in the backlog."""
    while True:
        try:
            connection, _ = listener.accept()
        except (BlockingIOError, OSError):
            return
        connection.close()
