"""Benchmark: data, model and pipeline parallelism on the same model, through the real train stage.

Every run uses the custom loop (pipeline_parallel needs it) at per-replica
batch 25 on the prepared digits tiled to 12,000, each in its own process; the
rounds alternate the configurations so machine noise spreads over all.
Reported: steady samples/s and ms per step, speed vs normal, parameters on
the busiest device, bytes moved per step, and the bubble measured and in theory.

    python -m benchmarks paradigms [--rounds 2] [--epochs 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from benchmarks.common import median, step_ms, table
from benchmarks.strategies import data_folder, run  # noqa: E402

CONFIGS = [  # label, strategy, overrides
    ("normal", "default", []),
    ("mirrored x2 (data)", "mirrored", []),
    ("model_parallel x2 (model)", "model_parallel", []),
    ("pipeline_parallel x2, M=5", "pipeline_parallel", ["distributed.micro_batches=5"]),
    ("pipeline_parallel x2, M=25", "pipeline_parallel", ["distributed.micro_batches=25"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-paradigms-"))
    data = data_folder(root)
    reports: dict[str, list[dict]] = {label: [] for label, _, _ in CONFIGS}
    for round_ in range(args.rounds):
        for i, (label, strategy, sets) in enumerate(CONFIGS):
            reports[label].append(run(root, data, f"r{round_}-{i}", strategy, [
                *sets, "train.loop=custom", "train.batch_size=25", f"train.epochs={args.epochs}"]))
            print(f"round {round_ + 1} {label}: {reports[label][-1]['steady_samples_per_second']:,.0f} samples/s",
                  file=sys.stderr, flush=True)
    base = median([r["steady_samples_per_second"] for r in reports["normal"]])
    rows = []
    for label, runs in reports.items():
        speed = median([r["steady_samples_per_second"] for r in runs])
        step_ms = median([step_ms(r) for r in runs])
        bubbles = [r["bubble"] for r in runs if r["bubble"] is not None]
        theory = runs[0]["bubble_theory"]
        rows.append([label, speed, f"{step_ms:.2f}", f"{speed / base:.2f}x", f"{max(runs[0]['params_per_device']):,}",
                     f"{runs[0]['bytes_per_step']:,}",
                     f"{median(bubbles):.0%}" if bubbles else "–", f"{theory:.0%}" if theory is not None else "–"])
    print(f"custom loop, per-replica batch 25, 12,000 digits, {args.epochs} epochs, median of {args.rounds} rounds")
    print(table(["run", "samples/s", "ms/step", "vs normal", "parameters on a device", "bytes moved per step",
                 "bubble measured", "bubble in theory"], rows))


if __name__ == "__main__":
    main()
