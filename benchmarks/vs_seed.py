"""Benchmark 1: the seed's way of training against the project's train path.

Same data (a full-size MNIST-format set: 60,000 distinct training digits made from
the offline sample's real ones by shifts, see ``common.full_size_mnist``; 1,000 real
test digits), same model, same epochs, batch 25, default strategy; then both models
on the test split.

- The seed's way is the script this project grew from, as written: a
  Sequential model, ``compile("adam", ...)``, ``model.fit(X_train, y_train,
  epochs=..., batch_size=25)`` on NumPy arrays, TensorFlow's default threads
  (its progress output is discarded, so the terminal costs it nothing).
- The project's way is ``tfdist.train.fit.train_model`` with the project's
  defaults: a cached, prefetched tf.data pipeline, ``steps_per_execution``
  and the ``runtime`` thread settings.

Each run is its own process (thread settings are per process), A and B
alternating ``--reps`` times. An epoch's training time excludes validation;
samples/s is steady state (median of the epochs after the first).

    python -m benchmarks vs_seed [--epochs 5] [--reps 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import time

ROWS = 60_000
WAYS = ("seed", "project-newer-adam", "project")


def seed_way(epochs: int) -> tuple[float, float]:
    from common import accuracy, full_size, median

    from tfdist.data.prepared import scaled
    from tfdist.tf_imports import keras

    train, test = full_size("train"), full_size("test")

    class EpochSeconds(keras.callbacks.Callback):
        seconds: list[float] = []

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            self.seconds.append(time.perf_counter() - self.start)

    keras.utils.set_random_seed(42)
    model = keras.Sequential([
        keras.layers.Dense(128, activation="relu", input_shape=(784,)),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    timer = EpochSeconds()
    with contextlib.redirect_stdout(io.StringIO()):
        model.fit(scaled(train.x), train.y, epochs=epochs, batch_size=25, callbacks=[timer])
    return len(train) / median(timer.seconds[1:]), accuracy(model, test)


def project_way(epochs: int, fused_optimizer: bool = True) -> tuple[float, float]:
    from common import FULL_SIZE_SPEC, accuracy, config, full_size, train_quietly

    from tfdist.distribute.builders import build_strategy
    from tfdist.distribute.registry import get_spec
    from tfdist.runtime.threads import configure_threads, op_threads
    from tfdist.train import models

    if not fused_optimizer:  # the project before the fused (legacy) optimizers: the newer Adam
        models._OPTIMIZERS["adam"] = (models._OPTIMIZERS["adam"][1],) * 2

    settings = config(epochs=epochs, batch_size=25)
    configure_threads(*op_threads(settings))
    spec = get_spec("default")
    strategy, info = build_strategy(spec)
    train, val, test = full_size("train"), full_size("val"), full_size("test")
    result = train_quietly(settings, spec, strategy, info, train, val, FULL_SIZE_SPEC)
    return result.steady_samples_per_second, accuracy(result.model, test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--one", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        speed, test_accuracy = {"seed": seed_way, "project": project_way,
                                "project-newer-adam": lambda e: project_way(e, fused_optimizer=False)}[args.one](args.epochs)
        print(json.dumps({"samples_per_second": speed, "test_accuracy": test_accuracy}))
        return

    from common import median, table

    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    for rep in range(args.reps):
        for way in runs:
            out = subprocess.run([sys.executable, "-m", __spec__.name, "--one", way, "--epochs", str(args.epochs)],
                                 capture_output=True, text=True, check=True).stdout
            runs[way].append(json.loads(out.strip().splitlines()[-1]))
            print(f"rep {rep + 1} {way}: {runs[way][-1]['samples_per_second']:,.0f} samples/s, "
                  f"test accuracy {runs[way][-1]['test_accuracy']:.4f}", flush=True)
    seed = median([r["samples_per_second"] for r in runs["seed"]])
    rows = []
    for way, label in (("seed", "seed: fit(X, y, batch_size=25) on NumPy"),
                       ("project-newer-adam", "project before: train_model with the newer Adam"),
                       ("project", "project: train_model (tf.data, steps_per_execution, threads, fused Adam)")):
        speed = median([r["samples_per_second"] for r in runs[way]])
        rows.append([label, speed, f"{speed / seed:.2f}x", f"{median([r['test_accuracy'] for r in runs[way]]):.4f}"])
    print()
    print(f"{ROWS:,} training digits, {args.epochs} epochs, batch 25, median of {args.reps} alternating runs")
    print(table(["way", "samples/s", "vs seed", "test accuracy"], rows))


if __name__ == "__main__":
    main()
