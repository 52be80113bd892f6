"""Benchmark: mixed_bfloat16 against float32, side by side, in throughput and in time to accuracy.

bfloat16 halves the bytes of every activation and runs matrix work on a
bfloat16 unit where the CPU has one (AVX512-BF16 or AMX); without one, oneDNN
converts to float32 and back around every op. This reads the CPU at run time
and says which case it measured. Normal training through the real train stage
on all of this machine's CPUs (``runtime.onednn: auto``: oneDNN, which runs
bfloat16's kernels, is on for the convnet), the prepared digits tiled to
12,000, the two precisions alternating within every round; the table gives
the median step and its spread, the speed and the time to the model's target
validation accuracy (mlp 0.90, cnn 0.95) against float32.

    python -m benchmarks bfloat16 [--models mlp cnn] [--batches 25 256] [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from benchmarks.common import median, model_rounds, model_rounds_options, spread, table  # noqa: E402
from benchmarks.strategies import TARGETS, add_against, data_folder, measured, run  # noqa: E402
from tfdist.hardware import cpu_model, usable_cpus  # noqa: E402
from tfdist.train.precision import hardware_support  # noqa: E402

PRECISIONS = ("float32", "mixed_bfloat16")


def main() -> None:
    args = model_rounds_options(__doc__)
    support = hardware_support("mixed_bfloat16")
    print(f"{cpu_model()}, {len(usable_cpus())} CPU(s): bfloat16 unit {'yes' if support.can_be_faster else 'no'} "
          f"({support.reason})", flush=True)
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-bfloat16-"))
    data = data_folder(root)
    cells: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for round_, model, batch, sets in model_rounds(args):
        runs = {}
        for precision in PRECISIONS:
            name = f"r{round_}-{model}-b{batch}-{precision}"
            run(root, data, name, "default", [*sets, f"train.precision={precision}"])
            runs[precision] = measured(root, name)
        for precision, found in runs.items():
            cell = cells[(model, batch, precision)]
            add_against(cell, found, runs["float32"], TARGETS[model])
            print(f"round {round_ + 1} {model} batch {batch} {precision}: {found['step_ms']:.2f} ms/step, "
                  f"{cell['speed'][-1]:.2f}x float32, val accuracy {found['val_accuracy']:.4f}",
                  file=sys.stderr, flush=True)
    rows = []
    for model in args.models:
        for batch in args.batches:
            for precision in PRECISIONS:
                cell = cells[(model, batch, precision)]
                rows.append([model, batch, precision, spread(cell["step"]), spread(cell["speed"]) + "x",
                             spread(cell["tta"]) + "x" if len(cell["tta"]) == args.rounds else "not reached",
                             f"{median(cell['accuracy']):.4f}"])
    print(f"normal training on {len(usable_cpus())} CPU(s) ({cpu_model()}), 12,000 digits, {args.epochs} epochs, "
          f"median (lowest-highest) of {args.rounds} alternating rounds; time to accuracy to "
          + ", ".join(f"{model} {TARGETS[model]}" for model in args.models))
    print(table(["model", "batch", "precision", "ms/step", "speed vs float32", "time to accuracy vs float32",
                 "val accuracy"], rows))


if __name__ == "__main__":
    main()
