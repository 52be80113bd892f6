"""Gradients sent in 16 bits: each replica's gradient is rounded to float16 or bfloat16 on its way, by every optimizer.

In one process, under the default strategy: its all-reduce over one replica
returns what it is sent, so what arrives is the rounded gradient. (Two
strategies in one process that all-reduce different dtypes abort TensorFlow's
collectives for the rest of the process: their keys collide.) The sum across
processes is multi_worker_mirrored's: tests/train/test_own_data_kinds.py
trains two workers with it.
"""

import numpy as np
import pytest

from tfdist.tf_imports import keras, tf
from tfdist.train.collectives import gradient_bytes
from tfdist.train.compression import all_reduce_in, compress_gradients

#: 1 + 2^-12: float32 holds it, float16 (10 mantissa bits) and bfloat16 (7) round it to 1.
GRADIENT = 1 + 2.0**-12


def stepped(compression: str, optimizer_class, **options) -> np.ndarray:
    """The variable after one SGD step of learning rate 1 from 0 with gradient [GRADIENT, 0.5]: -(what arrived)."""
    variable = tf.Variable([0.0, 0.0])
    optimizer = optimizer_class(learning_rate=1.0, **options)
    compress_gradients(optimizer, compression)

    @tf.function
    def step():
        optimizer.apply_gradients([(tf.constant([GRADIENT, 0.5]), variable)])

    step()
    return variable.numpy()


@pytest.mark.parametrize("optimizer_class", [keras.optimizers.legacy.SGD, keras.optimizers.SGD],
                         ids=["fused (tf_keras's original)", "newer (clips)"])
@pytest.mark.parametrize(("compression", "arrived"), [("none", GRADIENT), ("float16", 1.0), ("bfloat16", 1.0)])
def test_each_optimizer_applies_the_gradient_as_the_compressed_dtype_carried_it(optimizer_class, compression, arrived):
    np.testing.assert_array_equal(stepped(compression, optimizer_class), np.float32([-arrived, -0.5]))


def test_clipping_applies_in_float32_to_what_crossed_in_16_bits():
    variable = stepped("bfloat16", keras.optimizers.SGD, clipvalue=0.75)
    np.testing.assert_array_equal(variable, [-0.75, -0.5])
    assert variable.dtype == np.float32


def test_a_missing_gradient_stays_missing_and_the_others_arrive_in_their_own_dtype():
    a, b = tf.Variable(0.0), tf.Variable(0.0)
    (missing, _), (arrived, _) = all_reduce_in(tf.float16, [(None, a), (tf.constant(GRADIENT), b)])
    assert missing is None and arrived.dtype == tf.float32 and float(arrived) == 1.0


def test_the_wire_bytes_halve_under_compression():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert gradient_bytes(model) == 8 * 4 and gradient_bytes(model, "float16") == gradient_bytes(model, "bfloat16") == 8 * 2
