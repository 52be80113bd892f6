"""The seed model split over two devices: the same step as on one device, and GPipe's step the full batch's gradient."""

import numpy as np
import pytest

from tfdist.config import ModelConfig
from tfdist.distribute.placement import device_of
from tfdist.tf_imports import keras
from tfdist.train.models import DigitClassifier, PipelineClassifier, build_model

from helpers.devices import HAS_GPU, LOGICAL_CPUS, TWO_DEVICES

MODEL = ModelConfig(hidden_units=[32, 16], dropout=0.0)  # no dropout: the steps must agree exactly


def batch(size=24, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((size, 784), dtype=np.float32), rng.integers(0, 10, size)


def one_sgd_step(model, x, y):
    """One optimizer step (plain SGD, learning rate 1: the weights move by minus the gradient); the loss."""
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=1.0), loss=keras.losses.SparseCategoricalCrossentropy())
    loss = model.train_on_batch(x, y)
    return loss, [v.numpy() for v in model.trainable_variables]


@pytest.mark.skipif(not HAS_GPU and LOGICAL_CPUS < 2, reason="needs two devices")
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_model_parallel_puts_layers_on_two_devices_and_steps_like_one_device(loop):
    keras.utils.set_random_seed(3)
    whole = build_model(MODEL, loop)
    split = build_model(MODEL, loop, TWO_DEVICES)
    split.set_weights(whole.get_weights())
    assert [device_of(v) for v in split.trainable_variables] == [TWO_DEVICES[0]] * 4 + [TWO_DEVICES[1]] * 2
    x, y = batch()
    (loss_whole, after_whole), (loss_split, after_split) = one_sgd_step(whole, x, y), one_sgd_step(split, x, y)
    assert loss_split == pytest.approx(loss_whole, abs=1e-6)
    for a, b in zip(after_whole, after_split, strict=True):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)


@pytest.mark.parametrize("micro_batches", [1, 4, 6])
def test_a_pipelined_step_applies_the_full_batch_gradient(micro_batches):
    keras.utils.set_random_seed(4)
    whole = DigitClassifier(MODEL)
    whole.build((None, 784))
    pipelined = PipelineClassifier(MODEL, TWO_DEVICES, micro_batches)
    pipelined.build((None, 784))
    pipelined.set_weights(whole.get_weights())
    x, y = batch()
    (loss_whole, after_whole), (loss_piped, after_piped) = one_sgd_step(whole, x, y), one_sgd_step(pipelined, x, y)
    assert loss_piped == pytest.approx(loss_whole, rel=1e-5)
    for a, b in zip(after_whole, after_piped, strict=True):
        np.testing.assert_allclose(b, a, atol=2e-6, rtol=1e-5)  # the same sum, added in another order
