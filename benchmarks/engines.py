"""Benchmark: what each engine costs across machines, against TF_CONFIG by hand and the local launcher.

multi_worker_mirrored, 2 workers, the mlp on 12,000 digits, on 2 test hosts
(network namespaces with their own addresses and names, tests/helpers/netns.py):

- **local launcher**: both workers on host 0's loopback, as ``dvc repro`` runs them;
- **TF_CONFIG by hand**: a worker started on each host, TF_CONFIG naming both;
- **Slurm**: ``srun -N2 --ntasks-per-node=1`` on host 0, slurmctld there and a
  slurmd on each host (tests/helpers/slurm.py);
- **Ray**: a Ray node on each host (tests/helpers/ray_nodes.py), the stage on
  host 0 joining it (``distributed.launcher: ray``).

Slurm's and Ray's clusters are started once, before the rounds, as a user's
are already running (their start-up is printed apart). Each round runs every
engine once, in the same order; the table gives medians
and spreads of: the wall time from launch to the last process's exit; the
chief's own start to its first step (``startup_seconds``, from its process's
start: an engine's placing of it comes before); the wall time outside
``fit`` (start-up, placement, saving, tracking, exit); and the steady step.
Needs root, iproute2, Debian's slurm-wlm and munge (``make slurm``) and Ray.

    python -m benchmarks engines [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/helpers: the test hosts
from benchmarks.common import step_ms  # noqa: E402
from benchmarks.harness import Options  # noqa: E402
from benchmarks.results import Result, median, spread  # noqa: E402
from benchmarks.stage import data_folder, report, stage_command  # noqa: E402

from helpers import netns, ray_nodes, slurm  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PORT = 2222
#: Seconds any one run may take before the benchmark gives up on it.
RUN_TIMEOUT = 900


def wait(processes: list[subprocess.Popen], logs: list[Path], name: str) -> None:
    for process, log in zip(processes, logs, strict=True):
        if process.wait(timeout=RUN_TIMEOUT):
            raise SystemExit(f"{name}: exited {process.returncode}:\n{log.read_text()[-3000:]}")


TITLE = "multi_worker_mirrored across 2 test hosts under each engine: wall time, start-up and the steady step"
DEFAULTS = {"models": ("mlp",), "batches": (25,)}


@dataclass
class Context:
    """The test hosts with Slurm and Ray up on them, the scratch folder and data, and the stage's settings."""

    root: Path
    data: Path
    hosts: Any
    slurm: Any
    ray: Any
    sets: list[str]
    env: dict[str, str]
    runs: itertools.count
    stack: contextlib.ExitStack


def cells(options: Options) -> list[dict[str, Any]]:
    return [{"engine": label} for label in ENGINES]


def setup(options: Options) -> Context:
    for reason in (netns.available(), slurm.available()):
        if reason:
            raise SystemExit(f"error: {reason}")
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-engines-"))
    stack = contextlib.ExitStack()
    hosts = stack.enter_context(netns.TestHosts(2))
    started = time.monotonic()
    (root / "slurm").mkdir()
    cluster = slurm.PrivateSlurm(root / "slurm", hosts)
    cluster.start()
    stack.callback(cluster.stop)
    print(f"Slurm: slurmctld and 2 slurmd up in {time.monotonic() - started:.1f} s", file=sys.stderr)
    started = time.monotonic()
    ray = stack.enter_context(ray_nodes.RayNodes(hosts, root))
    print(f"Ray: 2 nodes up in {time.monotonic() - started:.1f} s", file=sys.stderr)
    sets = [f"model.kind={options.models[0]}", f"train.epochs={options.epochs}", f"train.batch_size={options.batches[0]}",
            "distributed.workers=2"]
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    return Context(root, data_folder(root), hosts, cluster, ray, sets, env, itertools.count(), stack)


def teardown(context: Context) -> None:
    context.stack.close()


def measure(cell: dict[str, Any], context: Context, options: Options) -> dict[str, float]:
    name = f"run{next(context.runs)}"
    started = time.monotonic()
    ENGINES[cell["engine"]](context, name)
    wall = time.monotonic() - started
    found = report(context.root, name)
    return {"wall_s": wall, "startup_s": found["startup_seconds"], "outside_fit_s": wall - found["train_seconds"],
            "step_ms": step_ms(found), "hosts": len(found["hardware"]["hosts"])}


def _command(context: Context, name: str, *extra: str) -> list[str]:
    return stage_command(context.root, context.data, name, "multi_worker_mirrored", [*context.sets, *extra])


def local(context: Context, name: str) -> None:
    log = context.root / f"{name}.log"
    wait([context.hosts.start(0, _command(context, name), context.env, REPO, log)], [log], name)


def by_hand(context: Context, name: str) -> None:
    tasks = {"worker": [f"{address}:{PORT}" for address in context.hosts.addresses]}
    logs = [context.root / f"{name}-{i}.log" for i in range(2)]
    envs = [{**context.env, "TF_CONFIG": json.dumps({"cluster": tasks, "task": {"type": "worker", "index": i}})}
            for i in range(2)]
    wait([context.hosts.start(i, _command(context, name), envs[i], REPO, logs[i]) for i in range(2)], logs, name)


def on_slurm(context: Context, name: str) -> None:
    log = context.root / f"{name}.log"
    command = context.slurm.client(["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *_command(context, name)])
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=REPO, env={**context.env, "SLURM_CONF": context.slurm.env["SLURM_CONF"]},
                              stdout=out, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT)
    if done.returncode:
        raise SystemExit(f"{name}: srun exited {done.returncode}:\n{log.read_text()[-3000:]}")


def on_ray(context: Context, name: str) -> None:
    log = context.root / f"{name}.log"
    command = _command(context, name, "distributed.launcher=ray", f"distributed.ray_address={context.ray.address}")
    wait([context.hosts.start(0, command, {**context.env, **ray_nodes.TOKEN}, REPO, log)], [log], name)


ENGINES: dict[str, Callable[[Context, str], None]] = {
    "local launcher (2 workers on host 0)": local, "TF_CONFIG by hand": by_hand, "Slurm (srun -N2)": on_slurm,
    "Ray (2 nodes)": on_ray}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    return (["engine", "hosts", "wall (s)", "chief's start to fit (s)", "outside fit (s)", "steady step (ms)"],
            [[cell.params["engine"], f"{median(cell.values('hosts')):.0f}", spread(cell.values("wall_s"), 1),
              spread(cell.values("startup_s"), 1), spread(cell.values("outside_fit_s"), 1), spread(cell.values("step_ms"))]
             for cell in result.cells])


