"""The tf.data input of training: batches at the global batch size on one worker, a shard per worker on several.

The images stay uint8 (a quarter of float32) in the cache; each batch is scaled
to float32 in [0, 1] as it is read (:func:`scale`), so a large set is held once, in bytes.
"""

from __future__ import annotations

from typing import Any

from tfdist.data.prepared import Split
from tfdist.tf_imports import tf


def scale(x: Any, y: Any) -> tuple[Any, Any]:
    """A batch of uint8 pixels as the models take them: float32 in [0, 1] (as :func:`tfdist.data.prepared.scaled`)."""
    return tf.cast(x, tf.float32) / 255.0, y


def make_dataset(split: Split, global_batch_size: int, *, shuffle: bool, seed: int, endless: bool = False,
                 skip: int = 0) -> Any:
    """A ``tf.data.Dataset`` of ``(x, y)`` batches at the global batch size.

    The data are cached in memory, reshuffled every epoch (seeded), batched with
    the remainder dropped, so every step has the same shape and the step
    function is traced once, and prefetched so input never waits on Python.
    Sharding is set to DATA explicitly, for the validation batches of several
    workers (each takes every n-th batch) instead of TensorFlow guessing (and
    warning) from a dataset it cannot split by file; several workers' training
    input is :func:`make_dataset_fn`'s. ``endless`` repeats the epochs without end (reshuffled each time),
    for a ``fit`` that counts its steps per epoch; ``skip`` batches of it are passed over (a resumed run's).
    """
    dataset = tf.data.Dataset.from_tensor_slices((split.features(), split.y)).cache()
    if shuffle:
        dataset = dataset.shuffle(len(split), seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(global_batch_size, drop_remainder=shuffle).map(scale)
    dataset = (dataset.repeat().skip(skip) if endless else dataset).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def make_dataset_fn(split: Split, global_batch_size: int, *, seed: int, own_order: bool = False, skip: int = 0) -> Any:
    """A dataset function: each input pipeline reads only its shard of the images, endless, batched per replica.

    One pipeline per worker process (``context.num_input_pipelines``): pipeline
    i keeps every n-th image from i on, caches them, reshuffles them every pass
    and batches them at the per-replica batch size, so a worker's input work
    is its 1/n of an epoch however many workers take part, and the workers'
    steps together read ``global_batch_size`` distinct images. (Given to
    ``tf.data`` as one dataset with ``AutoShardPolicy.DATA`` instead, every
    worker would build every global batch and keep its part: input work that
    grows with the workers.) A worker's shard is at least
    ``len(images) // n`` images, so it holds the ``len(images) // global_batch_size``
    steps of an epoch; ``fit`` counts them, the input never ends. ``skip`` batches
    of each pipeline are passed over first (a resumed run's epochs done).

    ``own_order`` is for ParameterServer training: TensorFlow (2.21) gives every
    ParameterServer worker the same input context (one pipeline, id 0) and runs
    one traced function on each, so neither the context nor a seed tells the
    workers apart, and with a fixed seed both would read the same batches in the
    same order. The shuffle's seed is then drawn on the worker, from its clock,
    when it creates its input: each worker's order is its own, and not
    reproducible, as the interleaving of asynchronous updates is not either.
    """
    x, y = split.features(), split.y

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(global_batch_size)
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id).cache()
        order = (tf.cast(tf.math.floormod(tf.timestamp() * 1e6, 2**31), tf.int64) + seed  # this worker's clock, in µs
                 if own_order else seed + context.input_pipeline_id)
        dataset = dataset.shuffle(len(x), seed=order, reshuffle_each_iteration=True)
        return dataset.batch(batch, drop_remainder=True).map(scale).repeat().skip(skip).prefetch(tf.data.AUTOTUNE)

    return dataset_fn
