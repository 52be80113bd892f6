"""Benchmark: how much slower one CPU of this machine computes while its other CPU computes too.

The emulated machines (benchmarks/emulated_machines.py) are CPUs of one
machine. Separate machines share nothing, but these CPUs share caches, memory
bandwidth and, on a virtual machine, whatever the host gives its virtual CPUs
at once. This runs normal training pinned to CPU 0 alone, then again with a
twin of it pinned to CPU 1 at the same time, alternating round by round, for
each model and per-replica batch (12,000 digits tiled from the prepared ones);
the ratio of the two steps is what the emulation charges every machine of a
cluster that one machine training alone does not pay.

    python -m benchmarks shared_cores [--models mlp cnn] [--batches 25 256] [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from benchmarks.common import median, model_rounds, model_rounds_options, spread, step_ms, table
from benchmarks.strategies import data_folder, report, stage_command  # noqa: E402
from tfdist.hardware import cpu_model, usable_cpus  # noqa: E402


def steps_ms(root: Path, data: Path, names: list[str], sets: list[str]) -> list[float]:
    """Normal training once per name, all at the same time, the i-th pinned to the i-th CPU: each one's ms/step."""
    cpus = usable_cpus()
    processes = [subprocess.Popen(["taskset", "-c", str(cpus[i]), *stage_command(root, data, name, "default", sets)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for i, name in enumerate(names)]
    for name, process in zip(names, processes, strict=True):
        _, err = process.communicate(timeout=1800)
        if process.returncode:
            raise SystemExit(f"{name}: the train stage exited {process.returncode}:\n{err[-2000:]}")
    return [step_ms(found)
            for found in (report(root, name) for name in names)]


def main() -> None:
    args = model_rounds_options(__doc__)
    if len(usable_cpus()) < 2:
        raise SystemExit("this needs 2 CPUs or more")
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-shared-cores-"))
    data = data_folder(root)
    steps: dict[tuple, list[float]] = defaultdict(list)
    for round_, model, batch, sets in model_rounds(args):
        tag = f"r{round_}-{model}-b{batch}"
        (alone,) = steps_ms(root, data, [f"{tag}-alone"], sets)
        beside, _twin = steps_ms(root, data, [f"{tag}-beside", f"{tag}-twin"], sets)
        steps[(model, batch, "alone")].append(alone)
        steps[(model, batch, "beside")].append(beside)
        print(f"round {round_ + 1} {model} batch {batch}: {alone:.2f} ms/step alone, {beside:.2f} beside a twin",
              file=sys.stderr, flush=True)
    rows = []
    for model in args.models:
        for batch in args.batches:
            alone, beside = steps[(model, batch, "alone")], steps[(model, batch, "beside")]
            rows.append([model, batch, spread(alone),
                         spread(beside),
                         f"{median(beside) / median(alone):.2f}x"])
    print(f"normal training pinned to CPU 0 ({cpu_model()}), alone and beside a twin on CPU 1, 12,000 digits, "
          f"{args.epochs} epochs, median (lowest-highest) ms/step of {args.rounds} alternating rounds")
    print(table(["model", "batch", "alone", "beside a twin", "slower by"], rows))


if __name__ == "__main__":
    main()
