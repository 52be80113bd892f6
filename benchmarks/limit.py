"""Benchmark: how close training gets to this machine's arithmetic limit.

Measures a float32 ``tf.matmul`` peak (square matrices, a chain of dependent
products in a tf.function, one thread per op and TensorFlow's all-core
default), counts the mlp's training FLOPs per example (forward 2 x weights,
backward twice that), and sets FLOPs x samples/s of the normal train path at
batch 25 and 256 (the prepared digits tiled to 60,000) against the all-core
peak. Every cell runs in a process of its own, the cells alternating round by
round.

    python -m benchmarks limit [--rounds 3] [--epochs 4] [--set size=1024]
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import config, in_own_process, prepared, train_quietly
from benchmarks.harness import Options
from benchmarks.results import Result, median, spread

TITLE = "the mlp's training against this machine's float32 matmul peak: FLOPs per second, and the share of the peak"
DEFAULTS = {"models": ("mlp",), "batches": (25, 256), "epochs": 4}
#: The mlp's multiply-adds per example (its biases are negligible): 6 FLOPs each a training example (2 + 4).
WEIGHTS = 784 * 128 + 128 * 10
FLOPS_PER_EXAMPLE = 6 * WEIGHTS


def matmul_peak(size: int, intra_op: int, repeats: int = 20) -> float:
    """FLOP/s of a chain of ``size``-square float32 matmuls with ``intra_op`` threads per op (0: all cores)."""
    from tfdist.runtime.threads import configure_threads
    from tfdist.tf_imports import tf

    configure_threads(intra_op, 0)
    a = tf.random.normal((size, size))
    b = tf.random.normal((size, size)) / size**0.5  # keeps the chain's values bounded

    @tf.function
    def chain(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        # Each product feeds the next: identical independent matmuls would be
        # computed once (common-subexpression elimination) and overstate the peak.
        for _ in range(repeats):
            a = tf.matmul(a, b)
        return a

    chain(a, b).numpy()
    seconds = []
    for _ in range(5):
        start = time.perf_counter()
        chain(a, b).numpy()
        seconds.append(time.perf_counter() - start)
    return 2 * size**3 * repeats / median(seconds)


def normal_speed(epochs: int, batch: int) -> float:
    """Steady samples/s of normal training at ``batch``, with the project's thread settings."""
    from tfdist.distribute.builders import build_strategy
    from tfdist.distribute.registry import get_spec
    from tfdist.runtime.threads import configure_threads, op_threads

    settings = config(epochs=epochs, batch_size=batch)
    configure_threads(*op_threads(settings))
    spec = get_spec("default")
    strategy, info = build_strategy(spec)
    return train_quietly(settings, spec, strategy, info, prepared("train", 60_000), prepared("val")
                         ).steady_samples_per_second


def cells(options: Options) -> list[dict[str, Any]]:
    return [{"run": "matmul", "cores": "one"}, {"run": "matmul", "cores": "all"},
            *({"run": "normal", "batch": batch} for batch in options.batches)]


def measure(cell: dict[str, Any], context: Any, options: Options) -> dict[str, float]:
    size = int(options.extra.get("size", 1024))
    call = (f"matmul_peak({size}, {1 if cell['cores'] == 'one' else 0})" if cell["run"] == "matmul"
            else f"normal_speed({options.epochs}, {cell['batch']})")
    value = in_own_process(__name__, call)
    if cell["run"] == "matmul":
        return {"gflops": value / 1e9}
    return {"samples_per_second": value, "gflops": FLOPS_PER_EXAMPLE * value / 1e9}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    peak = result.cell(run="matmul", cores="all")
    rows = []
    for cell in result.cells:
        gflops = cell.values("gflops")
        if cell.params["run"] == "matmul":
            cores = "one core" if cell.params["cores"] == "one" else "every core"
            rows.append([f"float32 matmul, {cores}", "", spread(gflops, 1), ""])
        else:
            share = f"{median(gflops) / median(peak.values('gflops')):.0%}" if peak else "–"
            rows.append([f"normal, batch {cell.params['batch']}", spread(cell.values("samples_per_second"), 0),
                         spread(gflops, 1), share])
    return ["run", "samples/s", "GFLOP/s", "of the all-core matmul peak"], rows
