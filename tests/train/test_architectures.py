"""Model kinds: the mlp, Keras's simple MNIST convnet, and the user's own builder, each with what it refuses."""

import numpy as np
import pytest
from click.testing import CliRunner

from stages import train
from tfdist.config.knobs import ModelConfig
from tfdist.distribute.placement import device_of
from tfdist.tf_imports import keras
from tfdist.train.architectures import StepSeededDropout, layer_stack, weighted
from tfdist.train.models import build_model, build_sequential, export_copy, trained_weights

from helpers.devices import HAS_GPU, LOGICAL_CPUS, TWO_DEVICES
from helpers.digits import MNIST
from helpers.project import tiny_params

CNN = ModelConfig(kind="cnn", dropout=0.0)


def test_the_cnn_is_keras_s_simple_mnist_convnet():
    trained = build_sequential(ModelConfig(kind="cnn", dropout=0.5), MNIST)
    assert isinstance(trained.layers[-2], StepSeededDropout) and len(trained.non_trainable_weights) == 1, \
        "trained with a dropout whose masks resume from a backup: one counter"
    model = build_sequential(ModelConfig(kind="cnn", dropout=0.5), MNIST, exported=True)  # what is saved
    assert model.count_params() == 34_826, "keras.io/examples/vision/mnist_convnet: 34,826 parameters"
    assert [type(layer).__name__ for layer in model.layers] == [
        "Reshape", "Conv2D", "MaxPooling2D", "Conv2D", "MaxPooling2D", "Flatten", "Dropout", "Dense"]
    assert model.layers[-2].rate == 0.5 and model.output_shape == (None, 10)
    assert weighted(layer_stack(CNN, MNIST), MNIST) == [False, True, False, True, False, False, False, True]


@pytest.mark.skipif(not HAS_GPU and LOGICAL_CPUS < 2, reason="needs two devices")
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_the_cnn_split_over_two_devices_steps_like_one_device_with_each_pooling_beside_its_convolution(loop):
    keras.utils.set_random_seed(5)
    whole, split = build_model(CNN, MNIST, loop), build_model(CNN, MNIST, loop, TWO_DEVICES)
    split.set_weights(whole.get_weights())
    assert [device_of(v) for v in split.trainable_variables] == [TWO_DEVICES[0]] * 4 + [TWO_DEVICES[1]] * 2
    rng = np.random.default_rng(0)
    x, y = rng.random((16, 784), dtype=np.float32), rng.integers(0, 10, 16)
    losses = []
    for model in (whole, split):
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss=keras.losses.SparseCategoricalCrossentropy())
        losses.append(model.train_on_batch(x, y))
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    for a, b in zip(trained_weights(whole), trained_weights(split), strict=True):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-4)


def write_builder(folder, name, body):
    """A module ``name`` in the workspace ``folder`` holding ``body`` (a builder), as a user writes one."""
    (folder / f"{name}.py").write_text("import tf_keras as keras\n\n" + body)
    return f"{name}:build"


def test_a_sequential_builder_is_taken_layer_by_layer_and_its_saved_copy_has_its_weights(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    builder = write_builder(tmp_path, "builder_small_conv", (
        "def build(input_shape, classes):\n"
        "    return keras.Sequential([keras.Input(input_shape), keras.layers.Conv2D(4, 3, activation='relu'),\n"
        "        keras.layers.Flatten(), keras.layers.Dense(classes, activation='softmax')])\n"))
    config = ModelConfig(kind="builder", builder=builder)
    model = build_model(config, MNIST, "custom")
    assert [type(layer).__name__ for layer in model.stack] == ["Reshape", "Conv2D", "Flatten", "Dense", "Activation"]
    assert model(np.zeros((3, 784), np.float32)).shape == (3, 10)
    copy = export_copy(model, config, MNIST)
    for a, b in zip(trained_weights(model), trained_weights(copy), strict=True):
        np.testing.assert_array_equal(a, b)


BAD_BUILDERS = [
    # (id, module body or None for no module, the module:function, fragment of the one line)
    ("does not import", None, "no_such_module_here:build", "cannot import no_such_module_here (ModuleNotFoundError"),
    ("not callable", "build = 3\n", "builder_not_callable:build", "has a int, not a function, named build"),
    ("no such function", "def make(a, b):\n    pass\n", "builder_no_function:build", "has no build"),
    ("raises", "def build(a, b):\n    raise ValueError('no GPU here')\n", "builder_raises:build",
     "raised ValueError: no GPU here"),
    ("not a model", "def build(a, b):\n    return [1, 2]\n", "builder_list:build",
     "returned a builtins.list, not a tf_keras Model"),
    ("wrong classes", "def build(a, b):\n    return keras.Sequential([keras.Input(a), keras.layers.Flatten(),\n"
     "        keras.layers.Dense(5, activation='softmax')])\n", "builder_five:build",
     "its output has shape (None, 5); it must give one probability per class of MNIST sample: (None, 10)"),
    ("logits", "def build(a, b):\n    return keras.Sequential([keras.Input(a), keras.layers.Flatten(),\n"
     "        keras.layers.Dense(b, kernel_initializer='ones')])\n", "builder_logits:build",
     "its outputs are not probabilities"),
    ("wrong input", "def build(a, b):\n    return keras.Sequential([keras.Input((10,)),\n"
     "        keras.layers.Dense(b, activation='softmax')])\n",
     "builder_wrong_input:build", "its model does not take input of shape (None, 28, 28, 1)"),
]


@pytest.mark.parametrize(("body", "builder", "fragment"), [c[1:] for c in BAD_BUILDERS], ids=[c[0] for c in BAD_BUILDERS])
def test_a_bad_builder_exits_2_with_one_line_before_training(tmp_path, prepared_copy, monkeypatch, body, builder, fragment):
    monkeypatch.chdir(tmp_path)
    if body is not None:
        (tmp_path / f"{builder.split(':')[0]}.py").write_text("import tf_keras as keras\n\n" + body)
    tiny_params(tmp_path, model={"kind": "builder", "builder": builder})
    result = CliRunner().invoke(train.main, ["--strategy", "default", "--name", "run"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if not line.startswith(("INFO ", "WARNING "))]
    assert errors == [errors[0]] and errors[0].startswith(f"error: model.builder {builder!r}"), result.stderr[-2000:]
    assert fragment in errors[0]
    assert "Epoch 1/" not in result.output and not (tmp_path / "models").exists()


def test_a_functional_builder_is_refused_by_a_layer_split_naming_why(tmp_path, prepared_copy, monkeypatch):
    monkeypatch.chdir(tmp_path)
    builder = write_builder(tmp_path, "builder_functional", (
        "def build(input_shape, classes):\n"
        "    inputs = keras.Input(input_shape)\n"
        "    x = keras.layers.Flatten()(inputs)\n"
        "    return keras.Model(inputs, keras.layers.Dense(classes, activation='softmax')(x))\n"))
    tiny_params(tmp_path, model={"kind": "builder", "builder": builder}, distributed={"devices": 2},
                train={"loop": "custom"})
    result = CliRunner().invoke(train.main, ["--strategy", "model_parallel", "--name", "run"])
    assert result.exit_code == 2
    assert "distributed.devices 2 > the 1 layer(s) with weights of the model (model.builder builder_functional:build: " \
           "a Sequential is its layers, any other model one)" in result.stderr


@pytest.mark.parametrize("config", [ModelConfig(), ModelConfig(hidden_units=[64, 32, 16]), CNN], ids=["mlp", "mlp3", "cnn"])
def test_the_layer_count_checked_before_tensorflow_starts_is_the_built_one(config):
    from tfdist.train.checks import layers_with_weights

    assert layers_with_weights(config) == sum(weighted(layer_stack(config, MNIST), MNIST))
