"""Benchmark 3: how close training gets to this machine's arithmetic limit.

Measures a float32 ``tf.matmul`` peak (square matrices, a tf.function loop,
the project's thread settings and TensorFlow's defaults), counts the seed
MLP's training FLOPs per example (forward 2 x weights, backward twice that),
and compares FLOPs x samples/s of the normal train path at batch 25 and 256
against the peak.

    python benchmarks/limit.py [--size 1024]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import config, median, prepared, quietly, table  # noqa: E402


def matmul_peak(size: int, repeats: int = 20) -> float:
    from tfdist.runtime import tf

    a = tf.random.normal((size, size))
    b = tf.random.normal((size, size))

    @tf.function
    def chain(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        total = tf.zeros((size, size))
        for _ in range(repeats):
            total += tf.matmul(a, b)
        return total

    chain(a, b).numpy()
    seconds = []
    for _ in range(5):
        start = time.perf_counter()
        chain(a, b).numpy()
        seconds.append(time.perf_counter() - start)
    return 2 * size**3 * repeats / median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()
    settings = config(epochs=4)
    from tfdist.strategies import configure_threads, make_strategy
    from tfdist.training import train_model

    configure_threads(settings.runtime.intra_op_threads, settings.runtime.inter_op_threads)
    peak_project = matmul_peak(args.size)
    strategy, info = make_strategy("default")
    train, val = prepared("train", 60_000), prepared("val")
    weights = sum(units_in * units_out for units_in, units_out in [(784, 128), (128, 10)])
    flops_per_example = 6 * weights  # forward 2 per weight, backward 4
    rows = []
    for batch in (25, 256):
        result = quietly(train_model, config(epochs=4, batch_size=batch), strategy, info, train, val)
        achieved = flops_per_example * result.steady_samples_per_second
        rows.append([f"normal, batch {batch}", result.steady_samples_per_second, f"{achieved / 1e9:.1f}",
                     f"{achieved / peak_project:.1%}"])
    print(f"matmul peak ({args.size}x{args.size} float32, intra-op threads "
          f"{settings.runtime.intra_op_threads}): {peak_project / 1e9:.1f} GFLOP/s")
    print(f"training FLOPs per example: {flops_per_example:,} (6 x {weights:,} weights)")
    print(table(["run", "samples/s", "GFLOP/s", "of matmul peak"], rows))


if __name__ == "__main__":
    main()
