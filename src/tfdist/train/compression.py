"""Gradients sent in 16 bits (``distributed.gradient_compression``): Horovod's fp16 compression, in the optimizer.

Each replica's gradients are cast to float16 or bfloat16, all-reduced (half
the bytes on the wire: multi_worker_mirrored packs them into one tensor), and
cast back, before the optimizer clips and applies them in float32. The cast
happens in the optimizer's own aggregation, which both loops reach:
``fit``'s built-in step through ``minimize``, the custom loop's through
``apply_gradients``, and a LossScaleOptimizer through the optimizer it wraps.
tf_keras's original optimizers aggregate through their ``gradient_aggregator``,
the newer ones through ``aggregate_gradients``; both are set on the instance.
"""

from __future__ import annotations

from typing import Any

from tfdist.tf_imports import keras, tf


def compress_gradients(optimizer: keras.optimizers.Optimizer, compression: str) -> None:
    """Make ``optimizer`` all-reduce its gradients in ``compression``'s dtype (``none``: leave it as it is)."""
    if compression == "none":
        return
    dtype = tf.as_dtype(compression)

    def aggregate(grads_and_vars: Any) -> list[tuple[Any, Any]]:
        return all_reduce_in(dtype, grads_and_vars)

    if isinstance(optimizer, keras.optimizers.legacy.Optimizer):
        optimizer.gradient_aggregator = aggregate
    else:
        optimizer.aggregate_gradients = aggregate


def all_reduce_in(dtype: tf.DType, grads_and_vars: Any) -> list[tuple[Any, Any]]:
    """The replicas' gradients summed with each sent as ``dtype``, back in its own dtype; None gradients kept."""
    pairs = list(grads_and_vars)
    present = [(g, v) for g, v in pairs if g is not None]
    if not present:
        return pairs
    summed = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, [tf.cast(g, dtype) for g, _ in present])
    reduced = iter([tf.cast(s, g.dtype) for s, (g, _) in zip(summed, present, strict=True)])
    return [(None, v) if g is None else (next(reduced), v) for g, v in pairs]
