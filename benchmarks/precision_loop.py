"""Benchmark 4: float32 / mixed_bfloat16 / mixed_float16 x fit / custom loop.

In one process (policies do not leak between models), default strategy, the
project's thread settings, the prepared digits tiled to 60,000, alternating
every configuration ``--reps`` times; steady-state samples/s and validation
accuracy.

    python -m benchmarks precision_loop [--epochs 4] [--reps 2]
"""

from __future__ import annotations

import argparse
import itertools

from benchmarks.common import config, prepared, table, train_quietly  # noqa: E402
from benchmarks.results import median  # noqa: E402

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    from tfdist.distribute.builders import build_strategy
    from tfdist.distribute.registry import get_spec
    from tfdist.runtime.threads import configure_threads, op_threads
    from tfdist.train.precision import hardware_support

    defaults = config()
    configure_threads(*op_threads(defaults))
    spec = get_spec("default")
    strategy, info = build_strategy(spec)
    train, val = prepared("train", 60_000), prepared("val")
    results: dict[tuple, list[tuple[float, float]]] = {}
    for _ in range(args.reps):
        for batch, loop, precision in itertools.product((25, 256), ("fit", "custom"), PRECISIONS):
            settings = config(epochs=args.epochs, batch_size=batch, loop=loop, precision=precision)
            result = train_quietly(settings, spec, strategy, info, train, val)
            results.setdefault((batch, loop, precision), []).append(
                (result.steady_samples_per_second, result.history[-1]["val_accuracy"]))
    rows = []
    for batch, loop in itertools.product((25, 256), ("fit", "custom")):
        base = median([s for s, _ in results[(batch, "fit", "float32")]])
        cells = []
        for precision in PRECISIONS:
            speed = median([s for s, _ in results[(batch, loop, precision)]])
            accuracy = median([a for _, a in results[(batch, loop, precision)]])
            cells.append(f"{speed:,.0f} ({speed / base:.2f}x, val {accuracy:.3f})")
        rows.append([batch, loop, *cells])
    for precision in PRECISIONS[1:]:
        support = hardware_support(precision)
        print(f"{precision}: can be faster here: {support.can_be_faster} ({support.reason})")
    print(table(["batch", "loop", *PRECISIONS], rows))


if __name__ == "__main__":
    main()
