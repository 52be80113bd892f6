"""Benchmark: the floor of a training step at batch 25, without Keras's ``fit`` around it.

The mlp trained by the least code that still does a real step: the whole
full-size training set as one tensor, each batch gathered by index inside one
``tf.function`` that runs ``steps`` steps (no tf.data iterator per step), a
``GradientTape``, the fused legacy Adam update, a loss and an accuracy sum;
beside it the project's own path (``fit`` on tf.data) on the same digits. The
floor's samples/s bound what any input pipeline or step function can gain over
the project's path on this machine: what is left is per-op overhead of the
step's own ~60 small ops. Each cell trains in a process of its own, the cells
alternating round by round.

    python -m benchmarks step_floor [--rounds 3] [--epochs 4] [--set steps=50]
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.common import FULL_SIZE_SPEC, accuracy, config, full_size, full_size_prepared, in_own_process, train_quietly
from benchmarks.harness import Options
from benchmarks.results import Result, spread

TITLE = "the mlp's step at batch 25: the least code that still trains, against the project's fit"
DEFAULTS = {"models": ("mlp",), "batches": (25,), "epochs": 4}
BATCH = 25


def cells(options: Options) -> list[dict[str, Any]]:
    return [{"path": "floor"}, {"path": "fit"}]


def measure(cell: dict[str, Any], context: Any, options: Options) -> dict[str, float]:
    steps = int(options.extra.get("steps", 50))
    call = f"floor({options.epochs}, {steps})" if cell["path"] == "floor" else f"fit({options.epochs}, {steps})"
    speed, test_accuracy = in_own_process(__name__, call)
    return {"samples_per_second": speed, "test_accuracy": test_accuracy}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    names = {"floor": "the floor: one tf.function of gathered batches, GradientTape, fused Adam",
             "fit": "the project's path: fit on tf.data"}
    rows = [[names[cell.params["path"]], spread(cell.values("samples_per_second"), 0),
             spread(cell.values("test_accuracy"), 4)] for cell in result.cells]
    return ["step", "samples/s", "test accuracy"], rows


def fit(epochs: int, steps: int) -> list[float]:
    """The project's normal training on the same digits: steady samples/s and test accuracy."""
    from tfdist.distribute.builders import build_strategy
    from tfdist.distribute.registry import get_spec
    from tfdist.runtime.threads import configure_threads, op_threads

    settings = config(epochs=epochs, batch_size=BATCH, steps_per_execution=steps)
    configure_threads(*op_threads(settings))
    spec = get_spec("default")
    strategy, info = build_strategy(spec)
    result = train_quietly(settings, spec, strategy, info, full_size_prepared("train"), full_size_prepared("val"),
                           FULL_SIZE_SPEC)
    return [result.steady_samples_per_second, accuracy(result.model, full_size("test"))]


def floor(epochs: int, steps: int) -> list[float]:
    """The least code that still trains the mlp: steady samples/s and test accuracy."""
    from tfdist.data.prepared import scaled
    from tfdist.runtime.threads import configure_threads
    from tfdist.tf_imports import keras, tf

    configure_threads(1, 2)
    train, test = full_size("train"), full_size("test")
    images, labels = tf.constant(scaled(train.x)), tf.constant(train.y)
    keras.utils.set_random_seed(42)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(10, activation="softmax")])
    optimizer = keras.optimizers.legacy.Adam(0.001)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def run(order: tf.Tensor, first: tf.Tensor) -> tf.Tensor:
        correct = tf.constant(0.0)
        for i in tf.range(steps, dtype=tf.int64):
            batch = order[(first + i) * BATCH:(first + i + 1) * BATCH]
            x, y = tf.gather(images, batch), tf.gather(labels, batch)
            with tf.GradientTape() as tape:
                predictions = model(x, training=True)
                loss = loss_fn(y, predictions)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            correct += tf.reduce_sum(tf.cast(tf.equal(tf.argmax(predictions, 1), y), tf.float32))
        return correct

    calls = len(train) // BATCH // steps
    speeds = []
    for epoch in range(epochs):
        order = tf.random.shuffle(tf.range(len(train), dtype=tf.int64), seed=epoch)
        start = time.perf_counter()
        for call in range(calls):
            run(order, tf.constant(call * steps, tf.int64))
        speeds.append(calls * steps * BATCH / (time.perf_counter() - start))
    return [statistics.median(speeds[1:]), accuracy(model, test)]
