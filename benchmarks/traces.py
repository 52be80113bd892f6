"""TensorFlow profiler captures of a running cluster through its profiler servers: what ps_profile and step_parts
share (their host events: :func:`tfdist.train.trace_parts.host_events`)."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

from benchmarks.stage import stage_command
from tfdist.cluster.ports import PROFILER_PORT_ENV, free_ports

REPO = Path(__file__).resolve().parent.parent
#: Captures tried, an epoch apart, before a run is given up: the profiler client sometimes gets no events.
CAPTURE_ATTEMPTS = 3


def capture(ports: list[int], logdir: Path, ms: int) -> None:
    """``ms`` of every task serving the profiler on ``ports`` (127.0.0.1), captured at once into ``logdir``."""
    from tfdist.tf_imports import tf

    addresses = ",".join(f"grpc://127.0.0.1:{port}" for port in ports)
    tf.profiler.experimental.client.trace(addresses, str(logdir), ms)


class _Capture(threading.Thread):
    """One capture of every task's profiler at once; ``failed`` says why it took nothing (the client's error)."""

    def __init__(self, ports: list[int], logdir: Path, ms: int):
        super().__init__(daemon=True)
        self.args_ = (ports, logdir, ms)
        self.failed: str | None = None

    def run(self) -> None:
        try:
            capture(*self.args_)
        except RuntimeError as error:  # the profiler client: no worker answered with events
            self.failed = str(error)


def profiled_stage(root: Path, data: Path, name: str, strategy: str, sets: list[str], tasks: int, ms: int) -> Path:
    """The train stage run ``name`` of ``strategy`` on the local launcher, its ``tasks`` tasks serving the profiler;
    ``ms`` of them all captured from epoch 3 (again at the next epochs, up to :data:`CAPTURE_ATTEMPTS` times, when a
    capture takes nothing). Returns the folder the traces are in."""
    base = free_ports(1)[0]
    logdir = root / "profiles" / name
    env = {**os.environ, PROFILER_PORT_ENV: str(base)}
    env.pop("TF_CONFIG", None)
    # captured from this process: the tasks stay on the machine's network (a private one would hide their profilers)
    command = stage_command(root, data, name, strategy, [*sets, "distributed.task_network=host"])
    attempts: list[_Capture] = []
    with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as stage:
        assert stage.stdout is not None
        for line in stage.stdout:
            epoch = re.search(r"Epoch (\d+)/(\d+)", line)
            busy_or_done = attempts and (attempts[-1].is_alive() or not attempts[-1].failed)
            # from epoch 3, and not in the last two: a capture must end before the calibration's all-reduces begin
            training = epoch and 3 <= int(epoch.group(1)) <= int(epoch.group(2)) - 2
            if training and not busy_or_done and len(attempts) < CAPTURE_ATTEMPTS:
                attempts.append(_Capture(list(range(base, base + tasks)), logdir, ms))
                attempts[-1].start()
        if attempts:
            attempts[-1].join(timeout=120)
    if stage.returncode:
        raise SystemExit(f"error: the train stage exited {stage.returncode}")
    if not attempts or attempts[-1].failed:
        why = attempts[-1].failed if attempts else "the run never reached epoch 3"
        raise SystemExit(f"error: no capture of {name} took events ({why}); run more epochs (--epochs)")
    time.sleep(0.5)
    return logdir
