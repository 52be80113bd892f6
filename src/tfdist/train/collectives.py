"""What an all-reduce costs between this cluster's workers, and a step without it: the calibration the compare
stage projects from.

Two probes, each all-reduced many times inside one ``tf.function`` as ``fit``
runs its steps: a 4-byte tensor (what any all-reduce pays, whatever it
carries: the latency) and a tensor the size of the model's gradients (what
the bytes add). Every worker runs it together, after training, through the
strategy that trained: the same ring, the same processes, the same cores.
Then each times one replica's step alone (:func:`tfdist.train.fit.step_alone`):
the compute, so that what is neither compute nor the all-reduce shows.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from tfdist.records.reports import CollectiveCosts
from tfdist.tf_imports import tf

#: The latency probe: one float32.
SMALL_ELEMENTS = 1


def all_reduce_loop(strategy: tf.distribute.Strategy, values: tf.Variable, steps: int) -> Any:
    """A ``tf.function`` that all-reduces ``values`` across the replicas ``steps`` times in a loop."""

    def reduce() -> Any:
        return tf.distribute.get_replica_context().all_reduce("sum", values * 1.0)

    @tf.function
    def loop() -> Any:
        total = tf.constant(0.0)
        for _ in tf.range(steps):
            total += tf.reshape(strategy.experimental_local_results(strategy.run(reduce))[0], [-1])[0]
        return total

    return loop


def step_samples(loop: Callable[[], Any], steps: int, repeats: int) -> list[float]:
    """Seconds of one of the ``steps`` a call of ``loop`` runs, for each of ``repeats`` calls after a first one
    (which traces it and warms the connections up)."""
    return alternated_samples([loop], steps, repeats)[0]


def alternated_samples(loops: list[Callable[[], Any]], steps: int, repeats: int) -> list[list[float]]:
    """:func:`step_samples` of each of ``loops``, their calls alternated, so that a slow spell of the machine
    falls on every loop alike rather than on whichever ran then."""
    for loop in loops:
        loop()
    seconds: list[list[float]] = [[] for _ in loops]
    for _ in range(repeats):
        for loop, samples in zip(loops, seconds, strict=True):
            start = time.perf_counter()
            loop()
            samples.append((time.perf_counter() - start) / steps)
    return seconds


def seconds_per_step(loop: Callable[[], Any], steps: int, repeats: int) -> float:
    """The median of :func:`step_samples`."""
    return statistics.median(step_samples(loop, steps, repeats))


def all_reduce_samples(strategy: tf.distribute.Strategy, *, elements: int, steps: int, repeats: int) -> list[float]:
    """Seconds of one all-reduce of ``elements`` float32 values, a sample per call of ``steps`` of them."""
    return step_samples(_probe(strategy, elements, steps), steps, repeats)


def _probe(strategy: tf.distribute.Strategy, elements: int, steps: int) -> Callable[[], Any]:
    with strategy.scope():
        values = tf.Variable(tf.ones([elements]), trainable=False)
    return all_reduce_loop(strategy, values, steps)


def time_all_reduce(strategy: tf.distribute.Strategy, *, elements: int, steps: int, repeats: int) -> float:
    """Median seconds of one all-reduce of ``elements`` float32 values (each call runs ``steps`` of them)."""
    return statistics.median(all_reduce_samples(strategy, elements=elements, steps=steps, repeats=repeats))


def calibrate(strategy: tf.distribute.Strategy, *, gradient_bytes: int, workers: int, steps: int = 20,
              repeats: int = 5, step_alone: Callable[[], Any] | None = None, steps_alone: int = 1) -> CollectiveCosts:
    """Time the two probes between the workers (every worker must call this, as it does ``fit``), then
    ``step_alone``, a call of which runs ``steps_alone`` steps of one replica without the strategy."""
    large_elements = max(SMALL_ELEMENTS + 1, gradient_bytes // 4)
    small_samples, large_samples = alternated_samples(
        [_probe(strategy, SMALL_ELEMENTS, steps), _probe(strategy, large_elements, steps)], steps, repeats)
    small, large = statistics.median(small_samples), statistics.median(large_samples)
    small_bytes, large_bytes = 4 * SMALL_ELEMENTS, 4 * large_elements
    per_byte = max(0.0, (large - small) / (large_bytes - small_bytes))
    alone = step_samples(step_alone, steps_alone, repeats) if step_alone else []
    return CollectiveCosts(workers=workers, small_bytes=small_bytes, small_seconds=small, large_bytes=large_bytes,
                           large_seconds=large, latency_seconds=small, seconds_per_byte=per_byte,
                           small_samples=small_samples, large_samples=large_samples,
                           compute_seconds=statistics.median(alone) if alone else None, compute_samples=alone)


def gradient_bytes(model: Any, compression: str = "none") -> int:
    """Bytes of the gradients one step all-reduces: the trainable variables' in their own dtype, or in
    ``compression``'s (``distributed.gradient_compression``: 2 bytes each)."""
    sent = None if compression == "none" else tf.as_dtype(compression).size
    return sum(v.shape.num_elements() * (sent or v.dtype.size) for v in model.trainable_variables)
