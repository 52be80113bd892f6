"""Ray as the engine of a multi-process strategy: the same tasks, placed and started by Ray.

With ``distributed.launcher: ray`` (and no TF_CONFIG) the train stage asks Ray
for a place for every task of the strategy's cluster (a placement group of one
CPU per task, spread over the nodes), starts a Ray actor in each place, and
writes each task's TF_CONFIG itself from where its actor landed: the actor's
node address and a free port there. Each actor runs this same train stage as
that task, in cluster mode, and streams its lines back. So waiting for peers,
heartbeats, the lost-peer messages, the chief's MLflow run and its outputs are
exactly those of a hand-made cluster, and parameter_server's chief, workers and
ps run on Ray as well as multi_worker_mirrored's workers: a TF_CONFIG of our own
has every role (Ray Train's TensorflowTrainer writes workers only; what each
costs a stage is in docs/cluster.md).

A SIGTERM to the stage is passed on to the tasks that train, which back up
and exit 75 (:mod:`tfdist.cluster.preemption`); so does the stage. A failed
attempt (a task exits non-zero, or its actor dies with its node)
stops every task and asks Ray for places again, up to
``distributed.max_restarts`` times; training resumes from the chief's backup.
A cluster without room (a lost node that never comes back) fails after
``distributed.connect_timeout`` seconds, naming the node.

On one machine (``distributed.ray_address: local``) it starts a local Ray
cluster whose every address is 127.0.0.1: by default Ray advertises the
machine's network address, and TF_CONFIG would carry it. With an address it
joins that cluster instead; every node then needs the project installed at
the same path (the task command is this stage's own).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tfdist import native_logs
from tfdist.cluster.launcher import SCRATCH_ENV, NoRoom, restarting
from tfdist.cluster.ports import free_ports, release_ports
from tfdist.cluster.preemption import PEERS_BACKING_UP, Notice, where_backed_up
from tfdist.cluster.processes import die_with_parent
from tfdist.config.knobs import DistributedConfig
from tfdist.distribute.cluster_spec import TF_CONFIG, ClusterTask, describe_cluster
from tfdist.distribute.registry import StrategySpec
from tfdist.errors import PREEMPTED_EXIT, InputError, Interrupted, Preempted, RunError

log = logging.getLogger(__name__)

#: Ray's switch for multi-node networking: off, every node address is the loopback one.
_RAY_NETWORKED_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: Where `ray start` and `ray get-auth-token --generate` keep the cluster's authentication token.
_TOKEN_FILE = Path.home() / ".ray" / "auth_token"
_TOKEN_HINT = "a cluster with token authentication needs its token in RAY_AUTH_TOKEN or ~/.ray/auth_token"
#: Seconds to wait for a Ray cluster's address to accept a connection before giving up.
RAY_CONNECT_TIMEOUT = 10.0
#: Seconds ray.init may take to start or join a cluster (a local one's start, docs/cluster.md, many times over).
RAY_INIT_TIMEOUT = 90.0
#: Seconds the actors of placed tasks may take to start and report their addresses.
ACTOR_START_TIMEOUT = 120.0


def launch_ray(spec: StrategySpec, distributed: DistributedConfig, command: Sequence[str],
               on_stop: Callable[[str], None]) -> None:
    """Run ``spec``'s cluster as Ray actors until it has trained (the chief writes the outputs).

    Raises:
        InputError: Ray is not installed, or ``distributed.ray_address`` is malformed or does not answer.
        RunError: the run failed and ``distributed.max_restarts`` restarts are used up, or
            the cluster had no room for the tasks within ``distributed.connect_timeout``.
        Interrupted: this process got SIGINT or SIGTERM.
    """
    local = distributed.ray_address == "local"
    # Read when Ray is imported, here and in every process it starts (they inherit them).
    if local or _on_loopback(distributed.ray_address):
        # Every node address 127.0.0.1: for a cluster this starts, and to join one that runs on
        # loopback (a driver that took the machine's address would look for its node there forever).
        os.environ[_RAY_NETWORKED_ENV] = "0"
    if not local and "RAY_AUTH_MODE" not in os.environ and (os.environ.get("RAY_AUTH_TOKEN") or _TOKEN_FILE.is_file()):
        # `ray start` turns token authentication on by default (Ray 2.60) and keeps its token in
        # ~/.ray/auth_token, but a driver joining sends it only in token mode: what Ray itself does
        # for a cluster it starts where a token exists.
        os.environ["RAY_AUTH_MODE"] = "token"
    try:
        import ray
    except ImportError:
        raise InputError("distributed.launcher ray needs Ray: install the ray extra (make install does; "
                         "or pip install 'ray>=2.60'), or set distributed.launcher local") from None
    where = "a local Ray cluster on 127.0.0.1" if local else f"the Ray cluster at {distributed.ray_address}"
    if not local:
        _check_reachable(distributed.ray_address)
    sizes = spec.task_counts(distributed.workers, distributed.ps)
    log.info("ray: running %s for %s on %s", describe_cluster({job: [""] * n for job, n in sizes.items()}),
             spec.name, where)
    _init_ray(ray, sum(sizes.values()), distributed.ray_address, where)
    try:
        placed: set[str] = set()  # the nodes the tasks ran on: named when one of them is lost for good
        restarting(lambda: _attempt(ray, spec, sizes, distributed.connect_timeout, command, placed, on_stop),
                   distributed.max_restarts)
    finally:
        ray.shutdown()
    log.info("ray: %s trained; the chief wrote the outputs", spec.name)


def _attempt(ray: Any, spec: StrategySpec, sizes: dict[str, int], room_timeout: float, command: Sequence[str],
             placed: set[str], on_stop: Callable[[str], None]) -> None:
    """One attempt: places for ``sizes``' tasks (per job), an actor in each, run until the tasks that train are done."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    count = sum(sizes.values())
    # a task per machine where there are several: the point of more machines is their cores
    group = placement_group([{"CPU": 1}] * count, strategy="SPREAD")
    actors: list[Any] = []
    try:
        _wait_for_room(ray, group, count, room_timeout, placed)
        # two threads: a SIGTERM's notice reaches the task while its lines stream
        host = ray.remote(num_cpus=1, max_restarts=0, max_concurrency=2)(_TaskHost)
        actors = [host.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i))
                  .remote() for i in range(count)]
        addresses = ray.get([actor.address.remote() for actor in actors], timeout=ACTOR_START_TIMEOUT)
        placed.update(address.rpartition(":")[0] for address in addresses)
        spots = iter(zip(addresses, actors, strict=True))
        layout = {job: [next(spots) for _ in range(n)] for job, n in sizes.items()}
        cluster = {job: [address for address, _ in places] for job, places in layout.items()}
        tasks = [(ClusterTask(cluster, job, i), actor) for job, places in layout.items()
                 for i, (_, actor) in enumerate(places)]
        _run_tasks(ray, spec, command, tasks)
    except BaseException as err:
        on_stop("KILLED" if isinstance(err, Interrupted) else "FAILED")
        if isinstance(err, ray.exceptions.GetTimeoutError):
            raise RunError(f"the actors of {spec.name}'s tasks did not start within {ACTOR_START_TIMEOUT:.0f} s") from None
        raise
    finally:
        for actor in actors:  # its worker process goes, and with it the task (die_with_parent)
            ray.kill(actor)
        remove_placement_group(group)


def _run_tasks(ray: Any, spec: StrategySpec, command: Sequence[str], tasks: Sequence[tuple[ClusterTask, Any]]) -> None:
    """Start every task, relay its lines, and return when the ones that train are done; a failure raises RunError,
    a preemption (this process's SIGTERM passed on, or a task's own) Preempted once those tasks backed up."""
    events: queue.Queue[tuple[str, tuple[str, int] | Preempted | None]] = queue.Queue()
    cwd = os.getcwd()  # the stage's paths are relative to it (dvc.yaml's are)
    for task, actor in tasks:
        stream = actor.run.options(num_returns="streaming").remote(task.name, list(command), task.to_tf_config(), cwd)
        threading.Thread(target=_follow, args=(ray, task.name, stream, events), name=f"ray-{task.name}",
                         daemon=True).start()
    # parameter_server's servers never end on their own: its chief is done when it is
    training = {task.name: actor for task, actor in tasks if task.is_chief or not spec.coordinated}
    notice, preempted, deadline = Notice(), None, float("inf")

    def pass_on() -> list[str]:
        for actor in training.values():
            actor.preempt.remote()
        return list(training)

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: notice.take(signum, pass_on))
    try:
        while training and time.monotonic() < deadline:
            notice.check()
            try:
                name, outcome = events.get(timeout=0.5)  # a timeout, so that the signals' handlers run
            except queue.Empty:
                continue
            if isinstance(outcome, Preempted):  # its peers get a moment to back up as well
                preempted, deadline = preempted or outcome, min(deadline, time.monotonic() + PEERS_BACKING_UP)
            elif isinstance(outcome, tuple) and preempted is None:  # (what failed, its exit code)
                if notice.stopped(outcome[1]):
                    raise Interrupted(signal.SIGTERM, "every task was stopped")
                raise RunError(outcome[0])
            elif name not in training and preempted is None:
                raise RunError(f"{name} ended before the chief was done")
            training.pop(name, None)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if preempted is not None:
        raise preempted


def _follow(ray: Any, name: str, stream: Any, events: queue.Queue) -> None:
    """Print a task's lines as its actor yields them; put how it ended in ``events`` (None: exit 0, a Preempted, or
    what failed and its exit code)."""
    lines: list[str] = []
    try:
        for ref in stream:
            item = ray.get(ref)
            if isinstance(item, str):
                sys.stderr.write(item)
                sys.stderr.flush()
                lines = [*lines[-20:], item]
                continue
            code = item
            if code < 0:
                events.put((name, (f"{name} was killed by {signal.Signals(-code).name}", code)))
            elif code == PREEMPTED_EXIT:
                events.put((name, Preempted(where_backed_up(lines, name))))
            elif code:
                events.put((name, (f"{name} exited with {code} (its last line above says why)", code)))
            else:
                events.put((name, None))
            return
        events.put((name, (f"{name}'s actor ended without its exit code", 1)))
    except Exception as err:  # the actor died: its node, raylet or worker process is gone
        events.put((name, (f"{name}'s Ray actor died ({_first_line(err)}): its node or raylet may be gone", 1)))


class _TaskHost:
    """One task's place on the Ray cluster: an address on its node, and the task's process there."""

    def __init__(self) -> None:
        import ray

        self.node = ray.util.get_node_ip_address()
        # held in this node's port book while the actor lives (a dead actor's are free again)
        self.port = free_ports(1, self.node)[0]
        self.process: subprocess.Popen | None = None

    def address(self) -> str:
        return f"{self.node}:{self.port}"

    def run(self, name: str, command: list[str], tf_config: str, cwd: str) -> Iterator[str | int]:
        """Run the stage as task ``name``: yield its lines, prefixed with the name, then its exit code."""
        release_ports([self.port])  # the task binds it now
        with tempfile.TemporaryDirectory(prefix="tfdist-scratch-") as scratch:
            self.process = process = subprocess.Popen(
                command, env={**os.environ, TF_CONFIG: tf_config, SCRATCH_ENV: scratch}, cwd=cwd,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                preexec_fn=die_with_parent())
            yield (f"INFO tfdist.cluster.ray_launcher: started {name} (pid {process.pid}) in Ray worker {os.getpid()} "
                   f"on node {self.node}\n")
            for line in process.stdout or ():  # the prefix says whose, as under the local launcher
                yield f"[{name}] {line}"
            yield process.wait()

    def preempt(self) -> None:
        """Pass a preemption's SIGTERM on to the task."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)


def _wait_for_room(ray: Any, group: Any, count: int, timeout: float, placed: set[str]) -> None:
    """Until Ray has reserved a CPU for each task, at most ``timeout`` s; then one line on what is missing."""
    if group.wait(timeout_seconds=timeout):
        return
    nodes = ray.nodes()
    alive = [node for node in nodes if node["Alive"]]
    lost = sorted({node["NodeManagerAddress"] for node in nodes if not node["Alive"]} & placed
                  - {node["NodeManagerAddress"] for node in alive})
    cpus = sum(node["Resources"].get("CPU", 0) for node in alive)
    why = (f"node {', '.join(lost)} left the cluster and did not come back" if lost else
           f"it has {cpus:g} CPUs on {len(alive)} node(s), some may be busy")
    raise NoRoom(f"no room on the Ray cluster for {count} tasks of 1 CPU within {timeout:g} s "
                   f"(distributed.connect_timeout): {why}")


def _init_ray(ray: Any, tasks: int, address: str, where: str) -> None:
    """Start or join Ray, quietly: Ray's own processes log nothing here below ERROR, and stream nothing.

    The tasks' own lines (relayed, :func:`_follow`) say what happened; Ray's
    logs stay in its session folder.
    """
    local = address == "local"
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    # ray.init retries a cluster it cannot join (wrong token, a node it cannot find) for minutes
    # without a word: bound it, and say where it was stuck.
    watchdog = threading.Timer(RAY_INIT_TIMEOUT, _give_up, args=(where,))
    watchdog.daemon = True
    watchdog.start()
    started = time.monotonic()
    try:
        ray.init(address=address, num_cpus=tasks if local else None, include_dashboard=False, log_to_driver=False,
                 logging_config=ray.LoggingConfig(log_level="ERROR"),
                 object_store_memory=100 * 1024 * 1024 if local else None)
    except Exception as err:  # Ray's connection errors have no common base
        raise RunError(f"could not start or join Ray ({where}): {_first_line(err)}; {_TOKEN_HINT}") from None
    finally:  # Ray's logging config (for its own processes) takes over this one's root logger: give it back
        watchdog.cancel()
        root.setLevel(level)
        root.handlers[:] = handlers
    logging.getLogger("ray").setLevel(logging.CRITICAL)  # its driver-side account of a failure: ours is one line
    _shorten_cluster_errors(ray)
    log.info("ray: joined %s in %.1f s", where, time.monotonic() - started)


def _shorten_cluster_errors(ray: Any) -> None:
    """Ray's driver prints each error the cluster publishes (a raylet's death: 20 lines of its log): keep its first line.

    Ray has no switch for it (``log_to_driver`` covers the workers' output only);
    its printer is looked up by name when a message comes, so replacing it here
    shortens what Ray says and leaves the rest of Ray alone.
    """
    worker = getattr(ray, "_private", None) and getattr(ray._private, "worker", None)
    if worker is None or not hasattr(worker, "print_to_stdstream"):
        return

    def first_lines(data: dict[str, Any], **_: Any) -> None:
        for message in data.get("lines", []):
            first = next((line.strip() for line in str(message).splitlines() if line.strip()), "")
            log.warning("ray: %s", first)

    worker.print_to_stdstream = first_lines


def _give_up(where: str) -> None:
    """The stage's end when ray.init hangs: nothing has started yet, so nothing is left to close."""
    sys.stderr.write(f"error: could not start or join Ray ({where}) within {RAY_INIT_TIMEOUT:.0f} s; {_TOKEN_HINT}\n")
    native_logs.exit_now(1)


def _check_reachable(address: str) -> None:
    """Fail in seconds, naming the address, when a Ray cluster to join does not answer (exit 2: fix the address).

    ``ray.init`` itself retries an unreachable address for minutes. ``auto`` finds the address Ray's own
    ``ray start`` left on this machine, and fails fast by itself.
    """
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"distributed.ray_address {address!r} must be local, auto, host:port or ray://host:port")
    try:
        socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT).close()
    except OSError as err:
        raise InputError(f"the Ray cluster at {address} does not answer ({err.strerror or err}): start it "
                       "(ray start --head) or fix distributed.ray_address; local starts one here") from None


def _on_loopback(address: str) -> bool:
    host = address.removeprefix("ray://").rpartition(":")[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def _first_line(error: BaseException) -> str:
    """What went wrong, from a Ray error: its first line that says something."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__)[:300]
