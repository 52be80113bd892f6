"""Benchmark: the train stage's step with TensorFlow's oneDNN kernels on and at TensorFlow's own default.

``runtime.onednn: enabled`` sets ``TF_ENABLE_ONEDNN_OPTS=1`` in every training
process; ``tensorflow`` leaves TensorFlow's default, which on an x86 CPU without
AVX-512 is off. This measures both through the real train stage, on all of this
machine's CPUs: normal training for each model kind, and for the convnet also
mirrored with one device (a strategy of one replica: nothing to exchange, so
any difference from normal training is the strategy's own step). The prepared
digits are tiled to 12,000; the settings alternate within every round, so both
see the same machine; the table gives the median step and the spread.

    python benchmarks/onednn.py [--models mlp cnn] [--batches 25 256] [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import median, model_rounds, model_rounds_options, table  # noqa: E402
from strategies import data_folder, run  # noqa: E402

from tfdist.hardware import cpu_model, usable_cpus  # noqa: E402

SETTINGS = ("tensorflow", "enabled")
#: The runs of each model: (label, strategy, extra settings).
RUNS = {"mlp": [("normal", "default", [])],
        "cnn": [("normal", "default", []), ("mirrored, 1 device", "mirrored", ["distributed.devices=1"])]}


def main() -> None:
    args = model_rounds_options(__doc__)
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-onednn-"))
    data = data_folder(root)
    steps: dict[tuple, list[float]] = defaultdict(list)
    for round_, model, batch, cell in model_rounds(args):
        for label, strategy, sets in RUNS[model]:
            for setting in SETTINGS:
                key = (model, batch, label, setting)
                name = f"r{round_}-{model}-b{batch}-{strategy}-{setting}"
                report = run(root, data, name, strategy, [*cell, f"runtime.onednn={setting}", *sets])
                steps[key].append(1000 * report["steady_epoch_seconds"] / report["steps_per_epoch"])
                print(f"round {round_ + 1} {model} batch {batch} {label}, oneDNN {setting}: "
                      f"{steps[key][-1]:.2f} ms/step", file=sys.stderr, flush=True)
    rows = []
    for model in args.models:
        for batch in args.batches:
            for label, _, _ in RUNS[model]:
                default, enabled = (steps[(model, batch, label, setting)] for setting in SETTINGS)
                rows.append([model, batch, label, f"{median(default):.2f} ({min(default):.2f}-{max(default):.2f})",
                             f"{median(enabled):.2f} ({min(enabled):.2f}-{max(enabled):.2f})",
                             f"{median(default) / median(enabled):.2f}x"])
    print(f"the train stage on {len(usable_cpus())} CPU(s) ({cpu_model()}), 12,000 digits, {args.epochs} epochs, "
          f"median (lowest-highest) ms/step of {args.rounds} alternating rounds")
    print(table(["model", "batch", "run", "TensorFlow's default", "oneDNN enabled", "enabled faster by"], rows))


if __name__ == "__main__":
    main()
