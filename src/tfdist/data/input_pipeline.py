"""The tf.data input of training and evaluation, streamed from the prepared shards: no process holds a split.

Training reads epoch by epoch: epoch ``e``'s file order and record order are
shuffled with seeds of its own (``seed`` and ``e``), its records go through a
bounded shuffle buffer (:func:`shuffle_buffer`), are decoded and scaled hundreds
at a time in parallel and batched with the remainder dropped (one batch shape:
the step function traced once), and cut at the epoch's steps; epochs follow one
another without end (``fit`` counts them), prefetched. So a resumed run starts
at its next epoch's batches without reading the epochs before, and each input
pipeline (worker) reads only its own files (:func:`make_dataset_fn`).
Validation and the test set are read in file order, once a pass.
"""

from __future__ import annotations

import logging
from typing import Any

from tfdist.data.prepared import LABEL_BYTES, DataSpec, PreparedSplit
from tfdist.tf_imports import tf

log = logging.getLogger(__name__)

#: The shuffle buffer's records at most, and its bytes at most: the buffer is what an input holds, whatever the set's
#: size (the shards were written in a random order, so the buffer mixes files already mixed).
SHUFFLE_RECORDS, SHUFFLE_BYTES = 10_000, 32 << 20
#: Records decoded at a time, at most, and their decoded bytes at most: a decoding call costs a fixed time beside its
#: bytes' work, which a call a batch of small images pays every step; a call on hundreds of records, cut into
#: batches after, pays it once for them all (docs/data.md).
DECODE_RECORDS, DECODE_BYTES = 512, 8 << 20
#: Bytes each file is read ahead by.
READ_BUFFER = 1 << 20
#: Far more epochs than any run trains: the training input's end.
ENDLESS = 1 << 40
#: Each epoch's seed is ``seed`` + ``epoch`` x this (a pipeline's own adds its index).
EPOCH_SEED_STRIDE = 1_000_003


def shuffle_buffer(split: PreparedSplit) -> int:
    """Records of ``split`` shuffled at a time: bounded by :data:`SHUFFLE_RECORDS` and :data:`SHUFFLE_BYTES`."""
    return max(1, min(len(split), SHUFFLE_RECORDS, SHUFFLE_BYTES // split.spec.record_bytes))


def decoder(spec: DataSpec) -> Any:
    """A function from a batch of records to ``(pixels as float32 in [0, 1], one flat row each; int64 labels)``."""

    def decode(records: Any) -> tuple[Any, Any]:
        raw = tf.io.decode_raw(records, tf.uint8)
        pixels = tf.reshape(raw[:, LABEL_BYTES:], (-1, spec.features))
        return tf.cast(pixels, tf.float32) / 255.0, tf.bitcast(raw[:, :LABEL_BYTES], tf.int64)

    return decode


def _decoded(batches: Any, spec: DataSpec, batch: int) -> Any:
    """Batches of ``batch`` records, decoded (:func:`decoder`) :func:`decode_chunk` records at a time and cut again:
    the same batches, decoded."""
    chunks = batches.rebatch(decode_chunk(spec, batch)).map(decoder(spec), num_parallel_calls=tf.data.AUTOTUNE)
    return chunks.rebatch(batch, drop_remainder=True)  # every chunk a whole number of batches: none dropped


def decode_chunk(spec: DataSpec, batch: int) -> int:
    """Records decoded at a time: a multiple of ``batch``, within :data:`DECODE_RECORDS` and :data:`DECODE_BYTES`
    where a batch is smaller."""
    fits = min(DECODE_RECORDS, DECODE_BYTES // (4 * spec.features))
    return batch * max(1, fits // batch)


def _epochs(split: PreparedSplit, batch: int, *, seed: Any, start_epoch: int, steps: int | None,
            shard: tuple[int, Any] | None = None, start_step: int = 0) -> Any:
    """Batches of ``split``'s records, epoch after epoch from ``start_epoch``'s batch ``start_step`` on, ``steps``
    batches each (None: one pass of the files each); ``shard`` ``(n, i)``: pipeline i of n, reading files i, i + n,
    ... (or, with fewer files than n, every n-th record from i on). The batches skipped are skipped before they are
    decoded: a run resumed late in a long epoch reads its first part again, and decodes none of it."""
    paths = [str(path) for path in split.paths]
    buffer = shuffle_buffer(split)
    by_record = shard is not None and len(paths) < shard[0]

    def epoch(number: Any) -> Any:
        own = tf.cast(seed, tf.int64) + (tf.cast(shard[1], tf.int64) if shard else 0) + number * EPOCH_SEED_STRIDE
        files = tf.data.Dataset.from_tensor_slices(paths)
        if shard is not None and not by_record:
            files = files.shard(*shard)
        records = tf.data.TFRecordDataset(files.shuffle(len(paths), seed=own), buffer_size=READ_BUFFER)
        if shard is not None and by_record:
            records = records.shard(*shard)
        batches = records.shuffle(buffer, seed=own + 1).batch(batch, drop_remainder=True)
        return batches.repeat().take(steps) if steps else batches  # a pipeline short of steps reads its files again

    batches = tf.data.Dataset.range(start_epoch, ENDLESS).flat_map(epoch).skip(start_step)
    return _decoded(batches, split.spec, batch).prefetch(tf.data.AUTOTUNE)


def make_dataset(split: PreparedSplit, batch: int, *, seed: int, start_epoch: int = 0, start_step: int = 0,
                 steps: int) -> Any:
    """The training input of one pipeline reading every file: ``steps`` batches of ``batch`` an epoch, endless,
    from epoch ``start_epoch``'s batch ``start_step``."""
    dataset = _epochs(split, batch, seed=seed, start_epoch=start_epoch, start_step=start_step, steps=steps)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def make_ordered(split: PreparedSplit, batch: int, *, endless: bool = False) -> Any:
    """``split`` in file order, batched (the last batch keeps its remainder), decoded: validation and test.

    Sharding is set to DATA explicitly, for the validation batches of several
    workers (each takes every n-th batch) instead of TensorFlow guessing from
    the files, which need not divide among the workers; ``endless`` repeats the
    passes, for a validation that counts its steps.
    """
    dataset = tf.data.TFRecordDataset([str(path) for path in split.paths], buffer_size=READ_BUFFER).batch(batch)
    dataset = dataset.map(decoder(split.spec), num_parallel_calls=tf.data.AUTOTUNE)  # (a rebatch defeats sharding)
    dataset = (dataset.repeat() if endless else dataset).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def make_dataset_fn(split: PreparedSplit, global_batch_size: int, *, seed: int, steps: int | None, pipelines: int,
                    by_worker_index: bool = False, start_epoch: int = 0, start_step: int = 0) -> Any:
    """A dataset function: each input pipeline (worker) reads only its own files, endless, batched per replica.

    Pipeline i of n reads files i, i + n, ... in an order of its own each epoch
    (its seed adds i), so a worker's input work is its 1/n of an epoch however
    many workers take part, and the workers' batches are distinct images. A
    worker's files hold about ``len(split) // n`` images; its epoch is ``steps``
    batches, its files read again where they hold fewer (the shards' sizes
    differ by a record at most). With fewer files than pipelines, each reads
    every file and keeps every n-th record (said once, in the log).

    ``by_worker_index`` is for ParameterServer training: TensorFlow (2.21) gives
    every ParameterServer worker the same input context (one pipeline, id 0),
    so the worker's index comes from the coordinator
    (``experimental_get_current_worker_index``) as its dataset is created on
    it, and ``steps`` is None: the coordinator hands steps to whichever worker
    is free, so a worker's input is pass after pass of its files.
    """
    paths = [str(path) for path in split.paths]
    if len(paths) < pipelines:
        log.warning("%d prepared %s files for %d input pipelines: each reads every file and keeps every %d-th "
                    "record (prepare more shards to give each worker files of its own)",
                    len(paths), split.name, pipelines, pipelines)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        if by_worker_index:
            shard = (pipelines, tf.distribute.coordinator.experimental_get_current_worker_index())
        else:
            shard = (context.num_input_pipelines, context.input_pipeline_id)
        return _epochs(split, context.get_per_replica_batch_size(global_batch_size), seed=seed,
                       start_epoch=start_epoch, start_step=start_step, steps=steps, shard=shard)

    return dataset_fn
