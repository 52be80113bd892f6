"""Benchmark 5: the speed knobs of the normal run, to choose their defaults.

``train.steps_per_execution`` (steps per call into the runtime) and
``train.jit_compile`` (XLA), at batch 25, default strategy, the prepared
digits tiled to 60,000, in one process with the project's thread settings;
then TensorFlow's default threads against the project's, each in its own
process (thread pools are fixed per process).

    python -m benchmarks knobs [--epochs 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from benchmarks.common import config, prepared, table, train_quietly  # noqa: E402

STEPS = (1, 10, 50, 200, 2400)  # 2400 = a whole epoch of 60,000 at batch 25


def one(epochs: int, intra: int, inter: int, **train: object) -> float:
    from tfdist.distribute.builders import build_strategy
    from tfdist.distribute.registry import get_spec
    from tfdist.runtime.threads import configure_threads

    configure_threads(intra, inter)
    spec = get_spec("default")
    strategy, info = build_strategy(spec)
    result = train_quietly(config(epochs=epochs, **train), spec, strategy, info, prepared("train", 60_000),
                           prepared("val"))
    return result.steady_samples_per_second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--threads", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        print(json.dumps(one(args.epochs, *args.threads)))
        return
    from tfdist.runtime.threads import op_threads

    defaults = config()
    intra, inter = op_threads(defaults)  # the mlp's (knobs measures it)
    rows = []
    for steps in STEPS:
        speeds = [one(args.epochs, intra, inter, steps_per_execution=steps, jit_compile=jit) for jit in (False, True)]
        rows.append([steps, *speeds])
        print(f"steps_per_execution {steps}: {speeds[0]:,.0f} / {speeds[1]:,.0f} samples/s (XLA off / on)", flush=True)
    print(table(["steps_per_execution", "samples/s", "samples/s with jit_compile"], rows))
    print()
    threads = []
    for setting in ((0, 0), (intra, inter)):
        out = subprocess.run([sys.executable, "-m", __spec__.name, "--epochs", str(args.epochs), "--threads", *map(str, setting)],
                             capture_output=True, text=True, check=True).stdout
        threads.append(["TensorFlow's default" if setting == (0, 0) else f"intra {setting[0]}, inter {setting[1]}",
                        json.loads(out.strip().splitlines()[-1])])
    print(table(["thread pools", "samples/s"], threads))


if __name__ == "__main__":
    main()
