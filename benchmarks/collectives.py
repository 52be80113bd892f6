"""Benchmark: a bare all-reduce between two MultiWorkerMirrored processes, small and gradient-sized.

Splits a collective's cost into latency and bytes: two worker processes on
loopback all-reduce a 4-byte tensor and the mlp's 407,080 bytes of gradients,
``steps`` times inside one ``tf.function`` (as ``fit`` runs its steps), median
of ``repeats`` calls: the train stage's own calibration
(:mod:`tfdist.train.collectives`), run longer. The workers run with one thread
per op, each pinned to a CPU of its own, or not; the two placements alternate
round by round.

    python -m benchmarks collectives [--rounds 3] [--set steps=50] [--set repeats=10]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from benchmarks.common import PLACEMENTS, placed, probe_costs
from benchmarks.harness import Options

TITLE = "a bare all-reduce between 2 processes on loopback: latency, cost per byte, pinned and not"
DEFAULTS = {"models": ("mlp",), "batches": (25,)}
SIZES = (1, 101_770)  # float32 elements: 4 bytes, and the mlp's parameters
#: The program each worker runs: argv = index, two ports, steps, repeats; worker 0 prints the two probes.
WORKER = """
import json, os, sys
index, ports, steps, repeats = int(sys.argv[1]), sys.argv[2:4], int(sys.argv[4]), int(sys.argv[5])
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                      "task": {"type": "worker", "index": index}})
from tfdist.runtime.threads import configure_threads
from tfdist.tf_imports import tf
from tfdist.train.collectives import time_all_reduce
configure_threads(1, 2)
ring = tf.distribute.experimental.CommunicationImplementation.RING
strategy = tf.distribute.MultiWorkerMirroredStrategy(
    communication_options=tf.distribute.experimental.CommunicationOptions(implementation=ring))
for size in SIZES:
    seconds = time_all_reduce(strategy, elements=size, steps=steps, repeats=repeats)
    if index == 0:
        print(json.dumps({"bytes": 4 * size, "seconds": seconds}), flush=True)
""".replace("SIZES", repr(SIZES))


def cells(options: Options) -> list[dict[str, Any]]:
    return [{"placement": placement} for placement in PLACEMENTS]


def measure(cell: dict[str, Any], context: Any, options: Options) -> dict[str, float]:
    from tfdist.cluster.ports import free_ports, release_ports
    from tfdist.cluster.processes import task_cpus

    steps, repeats = int(options.extra.get("steps", 50)), int(options.extra.get("repeats", 10))
    ports, cpus = free_ports(2), task_cpus(2)
    try:
        workers = [subprocess.Popen(
            placed([sys.executable, "-c", WORKER, str(i), *map(str, ports), str(steps), str(repeats)],
                   cell["placement"], cpus[i]),
            stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}) for i in range(2)]
        out, _ = workers[0].communicate(timeout=600)
        workers[1].wait(timeout=60)
    finally:
        release_ports(ports)
    small, large = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    costs = probe_costs(small, large)
    return {**costs, "mb_per_s": 1e3 / costs["ns_per_byte"]}


def table(result: Any) -> tuple[list[str], list[list[str]]]:
    from benchmarks.results import spread

    rows = [[cell.params["placement"], spread(cell.values("latency_ms")), spread(cell.values("large_ms")),
             spread(cell.values("ns_per_byte")), spread(cell.values("mb_per_s"))] for cell in result.cells]
    return ["workers", "4-byte all-reduce (latency), ms", "407,080-byte all-reduce, ms", "ns per further byte",
            "MB/s"], rows
