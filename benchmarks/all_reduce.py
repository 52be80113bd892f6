"""Benchmark: multi_worker_mirrored's all-reduce, auto vs ring (``distributed.all_reduce``), side by side.

Two local workers on loopback, the real train stage, per-replica batch 25 and
256 on the prepared digits tiled to 12,000; auto and ring alternate round by
round, each run in its own processes. On CPUs TensorFlow's AUTO resolves to
ring collectives, so the two should agree; NCCL needs GPUs on every worker.

    python -m benchmarks all_reduce [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from benchmarks.common import median, step_ms, table
from benchmarks.strategies import data_folder, run  # noqa: E402

IMPLEMENTATIONS = ("auto", "ring")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[25, 256])
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-allreduce-"))
    data = data_folder(root)
    rows = []
    for batch in args.batches:
        steps: dict[str, list[float]] = {name: [] for name in IMPLEMENTATIONS}
        for round_ in range(args.rounds):
            for name in IMPLEMENTATIONS:
                report = run(root, data, f"b{batch}-r{round_}-{name}", "multi_worker_mirrored", [
                    f"distributed.all_reduce={name}", "distributed.workers=2", f"train.batch_size={batch}",
                    f"train.epochs={args.epochs}"])
                steps[name].append(step_ms(report))
                print(f"batch {batch} round {round_ + 1} {name}: {steps[name][-1]:.2f} ms/step", file=sys.stderr, flush=True)
        base = median(steps["auto"])
        for name in IMPLEMENTATIONS:
            rows.append([batch, name, f"{median(steps[name]):.2f}", " ".join(f"{s:.2f}" for s in steps[name]),
                         f"{median(steps[name]) / base:.2f}x"])
    print(f"multi_worker_mirrored, 2 workers on loopback, median of {args.rounds} alternating rounds")
    print(table(["per-replica batch", "all_reduce", "ms/step", "runs (ms/step)", "vs auto"], rows))


if __name__ == "__main__":
    main()
