"""Ray Train as the engine of a multi_worker_mirrored run: the same tasks, started by Ray.

With ``distributed.launcher: ray`` (and no TF_CONFIG) the train stage hands
its cluster to ``ray.train.tensorflow.TensorflowTrainer``: Ray starts
``distributed.workers`` workers and writes each one's TF_CONFIG (workers only:
worker 0 is the chief), and each Ray worker runs this same train stage as that
task, in cluster mode. So waiting for peers, heartbeats, the lost-peer
messages, the chief's MLflow run and its outputs are exactly those of a
hand-made cluster. A failed attempt restarts every worker up to
``distributed.max_restarts`` times (Ray's ``FailureConfig``), and training
resumes from the chief's backup.

On one machine (``distributed.ray_address: local``) it starts a local Ray
cluster whose every address is 127.0.0.1: by default Ray advertises the
machine's network address, and TF_CONFIG would carry it. With an address it
joins that cluster instead; every node then needs the project installed at
the same path (the task command is this stage's own).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tfdist import native_logs
from tfdist.cluster.launcher import SCRATCH_ENV
from tfdist.cluster.processes import die_with_parent
from tfdist.config import DistributedConfig
from tfdist.distribute import cluster_spec
from tfdist.distribute.registry import StrategySpec
from tfdist.errors import InputError, Interrupted, RunError

log = logging.getLogger(__name__)

#: Ray's switch for multi-node networking: off, every node address is the loopback one.
_RAY_NETWORKED_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: Where `ray start` and `ray get-auth-token --generate` keep the cluster's authentication token.
_TOKEN_FILE = Path.home() / ".ray" / "auth_token"
_TOKEN_HINT = "a cluster with token authentication needs its token in RAY_AUTH_TOKEN or ~/.ray/auth_token"


def launch_ray(spec: StrategySpec, distributed: DistributedConfig, command: Sequence[str],
               on_stop: Callable[[str], None]) -> None:
    """Run ``spec``'s workers under Ray Train until the chief has written the outputs.

    Raises:
        InputError: Ray is not installed.
        RunError: the run failed and Ray's restarts are used up.
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
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.tensorflow import TensorflowTrainer
    except ImportError:
        raise InputError("distributed.launcher ray needs Ray Train: install the ray extra (make install does; "
                         "or pip install 'ray[train]>=2.60'), or set distributed.launcher local") from None
    where = "a local Ray cluster on 127.0.0.1" if local else f"the Ray cluster at {distributed.ray_address}"
    if not local:
        _check_reachable(distributed.ray_address)
    log.info("ray: running %d workers for %s on %s", distributed.workers, spec.name, where)
    with tempfile.TemporaryDirectory(prefix="tfdist-ray-") as scratch:
        _init_ray(ray, distributed, where)
        try:
            with _relayed_output() as lines:
                trainer = TensorflowTrainer(
                    _run_task,
                    train_loop_config={"command": list(command), "env": {SCRATCH_ENV: scratch}, "cwd": os.getcwd(),
                                       "lines": lines},
                    # a worker per machine where there are several: the point of more machines is their cores
                    scaling_config=ScalingConfig(num_workers=distributed.workers, resources_per_worker={"CPU": 1},
                                                 placement_strategy="SPREAD"),
                    run_config=RunConfig(name=f"tfdist-{spec.name}", storage_path=scratch,
                                         failure_config=FailureConfig(max_failures=distributed.max_restarts)),
                )
                trainer.fit()
        except Interrupted:
            on_stop("KILLED")
            raise
        except Exception as err:
            on_stop("FAILED")
            raise RunError(f"{spec.name} under Ray failed (after {distributed.max_restarts} restart(s), "
                           f"distributed.max_restarts): {_first_line(err)}") from None
        finally:
            ray.shutdown()
    log.info("ray: all %d workers finished; the chief wrote the outputs", distributed.workers)


def _init_ray(ray: Any, distributed: DistributedConfig, where: str) -> None:
    """Start or join Ray, quietly: Ray's own processes log nothing here below ERROR, and stream nothing.

    Ray's logs of a failed attempt are Python tracebacks of the task wrapper and
    of its own shutdown; the tasks' own lines (relayed, :func:`_relayed_output`)
    already say what happened, in one line. Ray's logs stay in its session folder.
    """
    local = distributed.ray_address == "local"
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    # ray.init retries a cluster it cannot join (wrong token, a node it cannot find) for minutes
    # without a word: bound it, and say where it was stuck.
    watchdog = threading.Timer(RAY_INIT_TIMEOUT, _give_up, args=(where,))
    watchdog.daemon = True
    watchdog.start()
    try:
        ray.init(address=distributed.ray_address, num_cpus=distributed.workers if local else None,
                 include_dashboard=False, log_to_driver=False, logging_config=ray.LoggingConfig(log_level="ERROR"),
                 object_store_memory=100 * 1024 * 1024 if local else None)
    except Exception as err:  # Ray's connection errors have no common base
        raise RunError(f"could not start or join Ray ({where}): {_first_line(err)}; {_TOKEN_HINT}") from None
    finally:  # Ray's logging config (for its own processes) takes over this one's root logger: give it back
        watchdog.cancel()
        root.setLevel(level)
        root.handlers[:] = handlers
    logging.getLogger("ray").setLevel(logging.CRITICAL)  # its driver-side account of a failure: ours is one line


@contextlib.contextmanager
def _relayed_output() -> Iterator[Any]:
    """A queue on the Ray cluster that the tasks put their output lines in, printed here as they come.

    Works wherever the workers run (Ray's own log streaming is off, see :func:`_init_ray`).
    """
    from ray.util.queue import Empty, Queue

    lines, done = Queue(), threading.Event()

    def relay() -> None:
        while True:
            try:
                sys.stderr.write(lines.get(timeout=0.2))
                sys.stderr.flush()
            except Empty:
                if done.is_set():
                    return
            except Exception:  # the queue's actor is gone: Ray is shutting down
                return

    thread = threading.Thread(target=relay, name="ray-task-output", daemon=True)
    thread.start()
    try:
        yield lines
    finally:
        done.set()
        thread.join(timeout=10)


#: Seconds to wait for a Ray cluster's address to accept a connection before giving up.
RAY_CONNECT_TIMEOUT = 10.0
#: Seconds ray.init may take to start or join a cluster (a local one starts in ~9 s here).
RAY_INIT_TIMEOUT = 90.0


def _give_up(where: str) -> None:
    """The stage's end when ray.init hangs: nothing has started yet, so nothing is left to close."""
    sys.stderr.write(f"error: could not start or join Ray ({where}) within {RAY_INIT_TIMEOUT:.0f} s; {_TOKEN_HINT}\n")
    native_logs.exit_now(1)


def _check_reachable(address: str) -> None:
    """Fail in seconds, naming the address, when a Ray cluster to join does not answer.

    ``ray.init`` itself retries an unreachable address for minutes (measured
    here: still waiting after 200 s). ``auto`` finds the address Ray's own
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
        raise RunError(f"the Ray cluster at {address} does not answer ({err.strerror or err}): start it "
                       "(ray start --head) or fix distributed.ray_address; local starts one here") from None


def _on_loopback(address: str) -> bool:
    host = address.removeprefix("ray://").rpartition(":")[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def _run_task(loop_config: dict[str, Any]) -> None:
    """In one Ray Train worker: run the train stage as the task Ray's TF_CONFIG names, and fail when it fails."""
    task = cluster_spec.read_tf_config()
    name = task.name if task else "a worker"
    # In the driver's folder: the stage's paths are relative to it (dvc.yaml's are), and Ray runs its workers elsewhere.
    process = subprocess.Popen(loop_config["command"], env={**os.environ, **loop_config["env"]}, cwd=loop_config["cwd"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                               preexec_fn=die_with_parent())
    import ray

    lines = loop_config["lines"]
    lines.put(f"INFO tfdist.cluster.ray_launcher: started {name} (pid {process.pid}) in Ray worker {os.getpid()} "
              f"on node {ray.util.get_node_ip_address()}\n")
    for line in process.stdout:  # the prefix says whose, as under the local launcher
        lines.put(f"[{name}] {line}")
    code = process.wait()
    if code < 0:
        raise RuntimeError(f"{name} was killed by {signal.Signals(-code).name}")
    if code:
        raise RuntimeError(f"{name} exited with {code} (its last line above says why)")


def _first_line(error: BaseException) -> str:
    """What went wrong, from a Ray error that may wrap a task's: our own task line when there is one."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    ours = next((line.removeprefix("RuntimeError: ") for line in lines
                 if line.startswith("RuntimeError: ") and ("exited with" in line or "was killed by" in line)), None)
    return (ours or (lines[0] if lines else type(error).__name__))[:300]
