"""Benchmark: the seed's way of training (the script this project grew from) against the project's train path.

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

Each run is its own process (thread settings are per process), the ways
alternating round by round. An epoch's training time excludes validation;
samples/s is steady state (median of the epochs after the first).

    python -m benchmarks vs_seed [--rounds 3] [--epochs 4]
"""

from __future__ import annotations

import contextlib
import io
import time
from typing import Any

from benchmarks.common import in_own_process
from benchmarks.harness import Options
from benchmarks.results import Result, median, spread

TITLE = "the seed's script's way of training against the project's train path, on 60,000 full-size digits"
DEFAULTS = {"models": ("mlp",), "batches": (25,), "epochs": 4}
ROWS = 60_000
WAYS = {"seed": "seed: fit(X, y, batch_size=25) on NumPy",
        "project-newer-adam": "project before: train_model with the newer Adam",
        "project": "project: train_model (tf.data, steps_per_execution, threads, fused Adam)"}


def seed_way(epochs: int) -> tuple[float, float]:
    from benchmarks.common import accuracy, full_size
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
    from benchmarks.common import FULL_SIZE_SPEC, accuracy, config, full_size, train_quietly
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


def one(way: str, epochs: int) -> dict[str, float]:
    """One way's training in this process: steady samples/s and test accuracy."""
    speed, test_accuracy = {"seed": seed_way, "project": project_way,
                            "project-newer-adam": lambda e: project_way(e, fused_optimizer=False)}[way](epochs)
    return {"samples_per_second": speed, "test_accuracy": test_accuracy}


def cells(options: Options) -> list[dict[str, Any]]:
    return [{"way": way} for way in WAYS]


def measure(cell: dict[str, Any], context: Any, options: Options) -> dict[str, float]:
    return in_own_process(__name__, f"one({cell['way']!r}, {options.epochs})", timeout=1800)


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    seed = result.cell(way="seed")
    rows = []
    for cell in result.cells:
        speed = median(cell.values("samples_per_second"))
        ratio = f"{speed / median(seed.values('samples_per_second')):.2f}x" if seed else "–"
        rows.append([WAYS[cell.params["way"]], spread(cell.values("samples_per_second"), 0), ratio,
                     spread(cell.values("test_accuracy"), 4)])
    return ["way", "samples/s", "vs seed", "test accuracy"], rows
