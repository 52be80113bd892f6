"""Benchmark: normal training's step at 1 thread per op and at every core, for each model kind.

``runtime.intra_op_threads: auto`` gives the seed MLP 1 thread per op and any
other model every core of its process (tfdist.runtime.intra_op_threads); this
measures why, through the real train stage on all of this machine's CPUs,
per-replica batch 25 and 256, the prepared digits tiled to 12,000. The
settings alternate round by round, so both see the same machine; the table
gives the median step and the spread (lowest-highest).

    python benchmarks/threads.py [--models mlp cnn] [--batches 25 256] [--rounds 3] [--epochs 3]
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


def main() -> None:
    args = model_rounds_options(__doc__)
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-threads-"))
    data = data_folder(root)
    cores = len(usable_cpus())
    settings = sorted({1, cores})
    steps: dict[tuple, list[float]] = defaultdict(list)
    for round_, model, batch, cell in model_rounds(args):
        for intra in settings:
            name = f"r{round_}-{model}-b{batch}-t{intra}"
            report = run(root, data, name, "default", [*cell, f"runtime.intra_op_threads={intra}"])
            steps[(model, batch, intra)].append(1000 * report["steady_epoch_seconds"] / report["steps_per_epoch"])
            print(f"round {round_ + 1} {model} batch {batch}, {intra} thread(s) per op: "
                  f"{steps[(model, batch, intra)][-1]:.2f} ms/step", file=sys.stderr, flush=True)
    rows = []
    for model in args.models:
        for batch in args.batches:
            one, every = (steps[(model, batch, intra)] for intra in (settings[0], settings[-1]))
            rows.append([model, batch, f"{median(one):.2f} ({min(one):.2f}-{max(one):.2f})",
                         f"{median(every):.2f} ({min(every):.2f}-{max(every):.2f})", f"{median(one) / median(every):.2f}x"])
    print(f"normal training on {cores} CPU(s) ({cpu_model()}), 12,000 digits, {args.epochs} epochs, "
          f"median (lowest-highest) ms/step of {args.rounds} alternating rounds")
    print(table(["model", "batch", "1 thread per op", f"{cores} threads per op", f"{cores} threads faster by"], rows))


if __name__ == "__main__":
    main()
