"""Benchmark 7: the floor of a training step at batch 25, without Keras's ``fit`` around it.

The mlp trained by the least code that still does a real step: the whole
full-size training set as one tensor, each batch gathered by index inside one
``tf.function`` that runs ``--steps`` steps (no tf.data iterator per step), a
``GradientTape``, the fused legacy Adam update, a loss and an accuracy sum. Its
samples/s bound what any input pipeline or step function can gain over the
project's path on this machine: what is left is per-op overhead of the step's
own ~60 small ops.

    python -m benchmarks step_floor [--epochs 4] [--steps 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.common import accuracy, full_size  # noqa: E402
from tfdist.data.prepared import scaled  # noqa: E402
from tfdist.runtime.threads import configure_threads  # noqa: E402
from tfdist.tf_imports import keras, tf  # noqa: E402

BATCH = 25


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=50, help="steps per call into the runtime")
    args = parser.parse_args()
    configure_threads(1, 2)
    train, test = full_size("train"), full_size("test")
    images, labels = tf.constant(scaled(train.x)), tf.constant(train.y)
    keras.utils.set_random_seed(42)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(10, activation="softmax")])
    optimizer = keras.optimizers.legacy.Adam(0.001)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    steps = args.steps

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
    for epoch in range(args.epochs):
        order = tf.random.shuffle(tf.range(len(train), dtype=tf.int64), seed=epoch)
        start = time.perf_counter()
        for call in range(calls):
            run(order, tf.constant(call * steps, tf.int64))
        speeds.append(calls * steps * BATCH / (time.perf_counter() - start))
    print(f"step floor: {statistics.median(speeds[1:]):,.0f} samples/s at steady state "
          f"({args.epochs} epochs, {steps} steps per call), test accuracy {accuracy(model, test):.4f}")


if __name__ == "__main__":
    main()
