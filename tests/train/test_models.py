"""The seed model split over two devices: the same step as on one device, and GPipe's step the full batch's gradient."""

import numpy as np
import pytest

from tfdist.config.knobs import ModelConfig
from tfdist.distribute.placement import device_of
from tfdist.tf_imports import keras
from tfdist.train.models import CustomLoopClassifier, PipelineClassifier, build_model, build_sequential

from helpers.devices import HAS_GPU, LOGICAL_CPUS, TWO_DEVICES
from helpers.digits import MNIST

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
    whole = build_model(MODEL, MNIST, loop)
    split = build_model(MODEL, MNIST, loop, TWO_DEVICES)
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
    whole = CustomLoopClassifier(MODEL, MNIST)
    whole.build((None, 784))
    pipelined = PipelineClassifier(MODEL, MNIST, TWO_DEVICES, micro_batches)
    pipelined.build((None, 784))
    pipelined.set_weights(whole.get_weights())
    x, y = batch()
    (loss_whole, after_whole), (loss_piped, after_piped) = one_sgd_step(whole, x, y), one_sgd_step(pipelined, x, y)
    assert loss_piped == pytest.approx(loss_whole, rel=1e-5)
    for a, b in zip(after_whole, after_piped, strict=True):
        np.testing.assert_allclose(b, a, atol=2e-6, rtol=1e-5)  # the same sum, added in another order


class Reads(keras.metrics.Metric):
    """Counts how often it is updated and how often read, in the training loop itself."""

    def __init__(self):
        super().__init__(name="reads")
        self.updated = self.add_weight(name="updated", initializer="zeros")
        self.read = self.add_weight(name="read", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.updated.assign_add(1.0)

    def result(self):
        return self.read.assign_add(1.0)

    def reset_state(self):
        pass  # counts across epochs


class Logs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append({key: value for key, value in logs.items() if key != "reads"})


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_fit_reads_the_metrics_on_the_last_step_of_each_execution_only_with_the_same_logs(loop):
    x, y = batch(size=240, seed=1)
    trained = {}
    for kind in ("tf_keras", "tfdist"):
        keras.utils.set_random_seed(5)
        model = build_sequential(MODEL, MNIST) if kind == "tf_keras" and loop == "fit" else build_model(MODEL, MNIST, loop)
        if kind == "tf_keras" and loop == "custom":  # the subclassed model with tf_keras's own train function
            model.make_train_function = lambda force=False, m=model: keras.Model.make_train_function(m, force)
        reads, logs = Reads(), Logs()
        model.compile(optimizer=keras.optimizers.legacy.Adam(0.01), loss=keras.losses.SparseCategoricalCrossentropy(),
                      metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy"), reads], steps_per_execution=5)
        model.fit(x, y, batch_size=24, epochs=2, shuffle=False, verbose=0, callbacks=[logs])
        trained[kind] = (reads.updated.numpy(), reads.read.numpy(), logs.batches,
                         [v.numpy() for v in model.trainable_variables])
    (keras_updates, keras_reads, keras_logs, keras_weights), (updates, reads, logs, weights) = trained.values()
    assert keras_updates == updates == 20, "ten steps an epoch, each updates the metrics"
    # fit also reads each metric once at the end of every epoch, outside the train function
    assert keras_reads == 20 + 2, "tf_keras reads every metric after every step"
    assert reads == 4 + 2, "tfdist reads them after the last step of each execution (5 steps) only"
    assert len(logs) == 4 and logs == keras_logs, "the callbacks get the same logs, once an execution"
    for a, b in zip(keras_weights, weights, strict=True):
        np.testing.assert_array_equal(b, a)
