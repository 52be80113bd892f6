"""Benchmark: what each engine costs across machines, against TF_CONFIG by hand and the local launcher.

multi_worker_mirrored, 2 workers, the seed MLP on 12,000 digits, on 2 test hosts
(network namespaces with their own addresses and names, tests/helpers/netns.py):

- **local launcher**: both workers on host 0's loopback, as ``dvc repro`` runs them;
- **TF_CONFIG by hand**: a worker started on each host, TF_CONFIG naming both;
- **Slurm**: ``srun -N2 --ntasks-per-node=1`` on host 0, slurmctld there and a
  slurmd on each host (tests/helpers/slurm.py);
- **Ray**: a Ray node on each host (tests/helpers/ray_nodes.py), the stage on
  host 0 joining it (``distributed.launcher: ray``).

Slurm's and Ray's clusters are started once, before the rounds, as a user's
are already running (their start-up is printed apart). Each round runs every
engine once, in an order that rotates round by round; the table gives medians
and spreads of: the wall time from launch to the last process's exit; the
chief's own start to its first step (``startup_seconds``, from its process's
start: an engine's placing of it comes before); the wall time outside
``fit`` (start-up, placement, saving, tracking, exit); and the steady step.
Needs root, iproute2, Debian's slurm-wlm and munge (``make slurm``) and Ray.

    python -m benchmarks engines [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/helpers: the test hosts
from benchmarks.common import spread, step_ms, table
from benchmarks.strategies import data_folder, report, stage_command  # noqa: E402

from helpers import netns, ray_nodes, slurm  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PORT = 2222
#: Seconds any one run may take before the benchmark gives up on it.
RUN_TIMEOUT = 900


def wait(processes: list[subprocess.Popen], logs: list[Path], name: str) -> None:
    for process, log in zip(processes, logs, strict=True):
        if process.wait(timeout=RUN_TIMEOUT):
            raise SystemExit(f"{name}: exited {process.returncode}:\n{log.read_text()[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    for reason in (netns.available(), slurm.available()):
        if reason:
            raise SystemExit(reason)
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-engines-"))
    data = data_folder(root)
    sets = [f"train.epochs={args.epochs}", "train.batch_size=25", "distributed.workers=2"]
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}

    with netns.TestHosts(2) as hosts:
        started = time.monotonic()
        cluster = slurm.PrivateSlurm(root / "slurm", hosts)
        (root / "slurm").mkdir()
        cluster.start()
        print(f"Slurm: slurmctld and 2 slurmd up in {time.monotonic() - started:.1f} s", file=sys.stderr)
        started = time.monotonic()
        with ray_nodes.RayNodes(hosts, root) as ray:
            print(f"Ray: 2 nodes up in {time.monotonic() - started:.1f} s", file=sys.stderr)

            def local(name: str) -> None:
                log = root / f"{name}.log"
                wait([hosts.start(0, stage_command(root, data, name, "multi_worker_mirrored", sets), env, REPO, log)],
                     [log], name)

            def by_hand(name: str) -> None:
                tasks = {"worker": [f"{address}:{PORT}" for address in hosts.addresses]}
                logs = [root / f"{name}-{i}.log" for i in range(2)]
                wait([hosts.start(i, stage_command(root, data, name, "multi_worker_mirrored", sets),
                                  {**env, "TF_CONFIG": json.dumps({"cluster": tasks, "task": {"type": "worker", "index": i}})},
                                  REPO, logs[i]) for i in range(2)], logs, name)

            def on_slurm(name: str) -> None:
                log = root / f"{name}.log"
                command = cluster.client(["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                                          *stage_command(root, data, name, "multi_worker_mirrored", sets)])
                with open(log, "w") as out:
                    done = subprocess.run(command, cwd=REPO, env={**env, "SLURM_CONF": cluster.env["SLURM_CONF"]},
                                          stdout=out, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT)
                if done.returncode:
                    raise SystemExit(f"{name}: srun exited {done.returncode}:\n{log.read_text()[-3000:]}")

            def on_ray(name: str) -> None:
                log = root / f"{name}.log"
                command = stage_command(root, data, name, "multi_worker_mirrored",
                                        [*sets, "distributed.launcher=ray", f"distributed.ray_address={ray.address}"])
                wait([hosts.start(0, command, {**env, **ray_nodes.TOKEN}, REPO, log)], [log], name)

            engines: dict[str, Callable[[str], None]] = {
                "local launcher (2 workers on host 0)": local, "TF_CONFIG by hand": by_hand,
                "Slurm (srun -N2)": on_slurm, "Ray (2 nodes)": on_ray}
            runs: dict[str, list[dict]] = {label: [] for label in engines}
            labels = list(engines)
            try:
                for round_ in range(args.rounds):
                    for label in labels[round_ % len(labels):] + labels[:round_ % len(labels)]:
                        name = f"r{round_}-{labels.index(label)}"
                        started = time.monotonic()
                        engines[label](name)
                        wall = time.monotonic() - started
                        found = report(root, name)
                        runs[label].append({"wall": wall, "startup": found["startup_seconds"],
                                            "outside": wall - found["train_seconds"],
                                            "step": step_ms(found),
                                            "hosts": len(found["hardware"]["hosts"])})
                        print(f"round {round_ + 1} {label}: {wall:.1f} s", file=sys.stderr, flush=True)
            finally:
                cluster.stop()

    def cell(results: list[dict], key: str, digits: int = 1) -> str:
        return spread([result[key] for result in results], digits)

    print(f"multi_worker_mirrored, 2 workers, mlp, batch 25, 12,000 digits, {args.epochs} epochs; "
          f"median (lowest-highest) of {args.rounds} rounds")
    print(table(["engine", "hosts", "wall (s)", "chief's start to fit (s)", "outside fit (s)", "steady step (ms)"],
                [[label, results[0]["hosts"], cell(results, "wall"), cell(results, "startup"),
                  cell(results, "outside"), cell(results, "step", 2)] for label, results in runs.items()]))


if __name__ == "__main__":
    main()
