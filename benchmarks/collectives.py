"""Benchmark: a bare all-reduce between two MultiWorkerMirrored processes, small and gradient-sized.

Splits a collective's cost into latency and bytes: two worker processes on
loopback all-reduce a 4-byte tensor and the mlp's 407,080 bytes of
gradients, ``--steps`` times inside one ``tf.function`` (as ``fit`` runs its
steps), median of ``--repeats`` calls: the train stage's own calibration
(tfdist.train.collectives), run longer. The workers run with the project's
thread settings, each pinned to a CPU of its own unless ``--unpinned``.

    python -m benchmarks collectives [--steps 50] [--repeats 10] [--unpinned]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import pinned, report_probes  # noqa: E402

SIZES = (1, 101_770)  # float32 elements: 4 bytes, and the mlp's parameters


def worker(index: int, ports: list[int], steps: int, repeats: int) -> None:
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                          "task": {"type": "worker", "index": index}})
    from tfdist.runtime.threads import configure_threads
    from tfdist.tf_imports import tf
    from tfdist.train.collectives import time_all_reduce

    configure_threads(1, 2)
    implementation = tf.distribute.experimental.CommunicationImplementation.RING
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=implementation))
    for size in SIZES:
        # the train stage's calibration, with more repeats
        seconds = time_all_reduce(strategy, elements=size, steps=steps, repeats=repeats)
        if index == 0:
            print(json.dumps({"bytes": 4 * size, "seconds": seconds}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--unpinned", action="store_true")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ports", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        return worker(args.worker, args.ports, args.steps, args.repeats)
    from tfdist.cluster.ports import free_ports
    from tfdist.cluster.processes import task_cpus

    ports = free_ports(2)
    cpus = task_cpus(2)
    processes = [subprocess.Popen(
        pinned([sys.executable, "-m", __spec__.name, "--worker", str(i), "--ports", *map(str, ports), "--steps", str(args.steps),
                "--repeats", str(args.repeats)], None if args.unpinned else cpus[i]),
        stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}) for i in range(2)]
    out, _ = processes[0].communicate(timeout=600)
    processes[1].wait(timeout=60)
    small, large = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    report_probes(f"all-reduce between 2 processes on loopback ({'unpinned' if args.unpinned else 'a CPU each'}):",
                  small, large, lambda per_byte: f" ({1 / per_byte / 1e6:,.0f} MB/s)")

if __name__ == "__main__":
    main()
