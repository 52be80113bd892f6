"""Benchmark 3: how close training gets to this machine's arithmetic limit.

Measures a float32 ``tf.matmul`` peak (square matrices, a tf.function loop,
the project's thread settings and TensorFlow's defaults), counts the seed
MLP's training FLOPs per example (forward 2 x weights, backward twice that),
and compares FLOPs x samples/s of the normal train path at batch 25 and 256
against the peak.

    python -m benchmarks limit [--size 1024]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from benchmarks.common import config, prepared, table, train_quietly  # noqa: E402
from benchmarks.results import median  # noqa: E402


def matmul_peak(size: int, repeats: int = 20) -> float:
    from tfdist.tf_imports import tf

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


def peak_in_process(size: int, intra_op: int) -> float:
    """The matmul peak with ``intra_op`` threads per op (0: all cores), in a fresh process."""
    out = subprocess.run([sys.executable, "-m", __spec__.name, "--size", str(size), "--peak", str(intra_op)],
                         capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--peak", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from tfdist.distribute.builders import build_strategy
    from tfdist.distribute.registry import get_spec
    from tfdist.runtime.threads import configure_threads, op_threads

    if args.peak is not None:
        configure_threads(args.peak, 0)
        print(matmul_peak(args.size))
        return
    settings = config(epochs=4)
    one_core, all_cores = peak_in_process(args.size, 1), peak_in_process(args.size, 0)
    configure_threads(*op_threads(settings))
    spec = get_spec("default")
    strategy, info = build_strategy(spec)
    train, val = prepared("train", 60_000), prepared("val")
    weights = 784 * 128 + 128 * 10  # the multiply-adds of one example; biases are negligible
    flops_per_example = 6 * weights  # forward 2 per weight, backward 4
    rows = []
    for batch in (25, 256):
        result = train_quietly(config(epochs=4, batch_size=batch), spec, strategy, info, train, val)
        achieved = flops_per_example * result.steady_samples_per_second
        rows.append([f"normal, batch {batch}", result.steady_samples_per_second, f"{achieved / 1e9:.1f}",
                     f"{achieved / all_cores:.0%}"])
    print(f"matmul peak ({args.size}x{args.size} float32): {one_core / 1e9:.1f} GFLOP/s on one core, "
          f"{all_cores / 1e9:.1f} GFLOP/s on all {os.cpu_count()} cores")
    print(f"training FLOPs per example: {flops_per_example:,} (6 x {weights:,} weights)")
    print(table(["run", "samples/s", "GFLOP/s", "of the all-core matmul peak"], rows))


if __name__ == "__main__":
    main()
