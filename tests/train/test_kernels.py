"""The oneDNN pass's output read from a real graph: a pooling gradient it left to Eigen is named."""

import os
import subprocess
import sys

from tfdist.train.kernels import fallbacks


def test_an_op_left_unrewritten_beside_its_rewritten_kind_or_forward_op_is_a_fallback():
    ops = ["_MklNativeMaxPool", "MaxPoolGrad", "MaxPoolGrad", "_MklNativeFusedConv2D", "MatMul", "BiasAddGrad"]
    assert fallbacks(ops) == {"MaxPoolGrad": 2}
    assert fallbacks(["_MklNativeMaxPool", "_MklNativeMaxPoolGrad", "Conv2D", "Conv2DBackpropFilter"]) == {}


FORCED = """
import tensorflow as tf
from tfdist.train.kernels import collected_graphs, fallbacks

@tf.custom_gradient
def pool(x):
    y = tf.nn.max_pool2d(x, 2, 2, "VALID")

    def grad(dy):  # fed from another op than the pooling: the pass leaves this gradient Eigen's
        again = tf.nn.avg_pool2d(x, 2, 2, "VALID") * 0.0 + tf.stop_gradient(y)
        return tf.raw_ops.MaxPoolGrad(orig_input=x, orig_output=again, grad=dy, ksize=[1, 2, 2, 1],
                                      strides=[1, 2, 2, 1], padding="VALID")
    return y, grad

@tf.function
def step(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(pool(x) ** 2)
    return tape.gradient(loss, x)

with collected_graphs() as ops:
    step(tf.random.uniform((4, 8, 8, 3)))
print(fallbacks(ops))
"""


def test_a_pooling_gradient_the_pass_could_not_rewrite_is_found_in_the_collected_graphs():
    done = subprocess.run([sys.executable, "-c", FORCED], env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "{'MaxPoolGrad': 1}"
