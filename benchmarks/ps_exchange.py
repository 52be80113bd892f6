"""Benchmark: the floor of a parameter_server worker step, a bare read and push of the variables.

What parameter_server's worker must do every step whatever the model: read
the variables from the ps (they live there) and send an update back. A worker
process and a ps process on loopback (each pinned to a CPU of its own, or
not: the two placements alternate round by round), a variable on the ps of 4
bytes and of the mlp's 407,080 bytes; one ``tf.function`` reads it onto the
worker and adds a worker-computed tensor of its size back, ``steps`` times (as
a closure packs its steps), median of ``repeats`` calls. Then as a step moves
them: the MLP's four variables each read and pushed, and tf_keras's four metric
variables (which live on the ps) updated. Against a parameter_server worker's
step (docs/performance/parallelism.md, section 8): what the exchange alone costs.

    python -m benchmarks ps_exchange [--rounds 3] [--set steps=50] [--set repeats=10]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from benchmarks.common import PLACEMENTS, placed, probe_costs
from benchmarks.harness import Options
from benchmarks.results import Result, spread

TITLE = "a parameter_server worker's bare exchange with its ps: a variable read and pushed, and as a step moves them"
DEFAULTS = {"models": ("mlp",), "batches": (25,)}

SIZES = (1, 101_770)  # float32 elements: 4 bytes, and the mlp's parameters
#: The mlp's variables (two kernels, two biases) and tf_keras's metric variables (loss and accuracy: total, count).
MODEL_TENSORS = ((784, 128), (128,), (128, 10), (10,))
METRIC_VARIABLES = 4


def cluster(ports: list[int]) -> dict[str, list[str]]:
    return {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}


def ps(ports: list[int]) -> None:
    from tfdist.tf_imports import tf

    tf.distribute.Server(tf.train.ClusterSpec(cluster(ports)), job_name="ps", task_index=0, protocol="grpc").join()


def worker(ports: list[int], steps: int, repeats: int) -> None:
    from tfdist.runtime.threads import configure_threads
    from tfdist.tf_imports import tf
    from tfdist.train.collectives import seconds_per_step

    configure_threads(1, 2)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster(ports)), task_type="worker", task_id=0, rpc_layer="grpc")
    tf.config.experimental_connect_to_cluster(resolver, job_name="worker", task_index=0,
                                              make_master_device_default=False)
    for size in SIZES:
        with tf.device("/job:ps/task:0"):
            variable = tf.Variable(tf.zeros([size]))

        @tf.function
        def exchange(variable: tf.Variable = variable) -> None:
            for _ in tf.range(steps):
                with tf.device("/job:worker/task:0"):
                    update = tf.identity(variable) * 0.5  # the read: ps -> worker
                variable.assign_add(update)  # the push: worker -> ps, applied there

        print(json.dumps({"bytes": 4 * size, "seconds": seconds_per_step(exchange, steps, repeats)}), flush=True)
    print(json.dumps({"model": True, "seconds": model_step(steps, repeats)}), flush=True)


def model_step(steps: int, repeats: int) -> float:
    """As a parameter_server step moves them: each of the model's variables read and its update pushed, and
    each metric variable (tf_keras keeps them on the ps) updated; median seconds a step."""
    from tfdist.tf_imports import tf
    from tfdist.train.collectives import seconds_per_step

    with tf.device("/job:ps/task:0"):
        variables = [tf.Variable(tf.zeros(shape)) for shape in MODEL_TENSORS]
        metrics = [tf.Variable(0.0) for _ in range(METRIC_VARIABLES)]

    @tf.function
    def exchange() -> None:
        for _ in tf.range(steps):
            with tf.device("/job:worker/task:0"):
                updates = [tf.identity(v) * 0.5 for v in variables]
                observed = tf.reduce_sum(updates[-1])
            for variable, update in zip(variables, updates, strict=True):
                variable.assign_add(update)
            for metric in metrics:
                metric.assign_add(observed)

    return seconds_per_step(exchange, steps, repeats)


def cells(options: Options) -> list[dict[str, Any]]:
    return [{"placement": placement} for placement in PLACEMENTS]


def measure(cell: dict[str, Any], context: Any, options: Options) -> dict[str, float]:
    from tfdist.cluster.ports import free_ports, release_ports
    from tfdist.cluster.processes import task_cpus

    steps, repeats = int(options.extra.get("steps", 50)), int(options.extra.get("repeats", 10))
    ports, cpus = free_ports(2), task_cpus(2)

    def start(call: str, index: int, **streams: Any) -> subprocess.Popen:
        command = [sys.executable, "-c", f"from benchmarks.ps_exchange import ps, worker; {call}"]
        return subprocess.Popen(placed(command, cell["placement"], cpus[index]),
                                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, text=True, **streams)

    server = start(f"ps({ports})", 0, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = start(f"worker({ports}, {steps}, {repeats})", 1, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = client.communicate(timeout=600)
        if client.returncode:
            raise RuntimeError(f"the worker exited {client.returncode}:\n{err[-2000:]}")
    finally:
        server.kill()
        server.wait(timeout=30)
        release_ports(ports)
    small, large, model = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {**probe_costs(small, large), "model_step_ms": 1e3 * model["seconds"]}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    rows = [[cell.params["placement"], *(spread(cell.values(metric)) for metric in
                                         ("latency_ms", "large_ms", "ns_per_byte", "model_step_ms"))]
            for cell in result.cells]
    return ["worker and ps", "4-byte variable read and pushed, ms", "407,080-byte variable, ms",
            "ns per further byte", f"as a step moves them (4 variables, {METRIC_VARIABLES} metric variables), ms"], rows
