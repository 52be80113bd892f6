"""What a model is made of: for each kind (:mod:`tfdist.model_kinds`), its layers from an image's flat pixels to the
class probabilities, in the function its record names, for the data it trains on (:class:`tfdist.data.prepared.DataSpec`:
its images' shape, its classes).

* :func:`mlp_layers`, the seed: Dense(relu) per ``model.hidden_units``, Dropout, Dense(K, softmax).
  (Dropout here is :class:`StepSeededDropout`, so a run resumed from a backup drops what the
  uninterrupted one would; the model that is saved has Keras's own.)
* :func:`cnn_layers`, Keras's "Simple MNIST convnet" (keras.io/examples/vision/mnist_convnet):
  the pixels as an image (28x28x1 for MNIST), Conv2D(32, 3, relu), MaxPool(2), Conv2D(64, 3, relu),
  MaxPool(2), Flatten, Dropout, Dense(K, softmax).
* :func:`user_layers`, the user's own: ``model.builder`` names ``package.module:function``,
  called as ``function((height, width, channels), K)``; it returns an uncompiled Keras model whose
  output is the K class probabilities. A Sequential is taken layer by layer (so model
  and pipeline parallelism can split it); any other model is one layer.

Every stack starts from an image's flat pixels (scaled to [0, 1]) and ends in a
float32 output, so a mixed-precision policy never computes the softmax and the
loss in 16 bits. Every call gives fresh layers: each model (replicas in a
strategy's scope, the float32 copy that is saved) is built anew from the kind.
"""

from __future__ import annotations

import importlib
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tfdist.config.knobs import ModelConfig
from tfdist.data.prepared import DataSpec
from tfdist.errors import InputError
from tfdist.files.workspace import workspace_root
from tfdist.model_kinds import model_kind
from tfdist.tf_imports import keras, tf


def layer_stack(config: ModelConfig, data: DataSpec, exported: bool = False) -> list[keras.layers.Layer]:
    """Fresh, unbuilt layers of ``config.kind`` for ``data``, from the flat pixels to the float32 class probabilities.

    ``exported``: for the model that is saved, which predicts only: Keras's
    own Dropout in place of :class:`StepSeededDropout` (no variable, loads anywhere).
    """
    build: Callable[[ModelConfig, DataSpec], list[keras.layers.Layer]] = globals()[model_kind(config.kind).layers]
    stack = build(config, data)
    if exported:
        stack = [keras.layers.Dropout(layer.rate, name=layer.name) if isinstance(layer, StepSeededDropout) else layer
                 for layer in stack]
    return stack


class StepSeededDropout(keras.layers.Layer):
    """Dropout whose masks are a function of the seed, the replica and how many times it has trained.

    Keras's Dropout draws from a random state no checkpoint holds, so a run
    resumed from a backup would drop other units than the uninterrupted run,
    and end with other weights. Here the count of training calls is a variable
    of the layer, which every backup keeps (local to each replica, as a
    metric's: no communication per step), and each mask is a stateless draw from it.
    """

    def __init__(self, rate: float, seed: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.rate = rate
        # As Keras seeds its own layers: from Python's generator, which keras.utils.set_random_seed seeds.
        self.seed = random.randrange(2**31) if seed is None else seed

    def build(self, input_shape: Any) -> None:
        self.calls = self.add_weight(name="calls", shape=(), dtype="int64", initializer="zeros", trainable=False,
                                     synchronization=tf.VariableSynchronization.ON_READ,
                                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        super().build(input_shape)

    def call(self, inputs: Any, training: Any = None) -> Any:
        if not training or self.rate == 0:
            return inputs
        context = tf.distribute.get_replica_context()
        replica = tf.cast(context.replica_id_in_sync_group if context else 0, tf.int64)
        calls = self.calls.assign_add(1)
        return tf.nn.experimental.stateless_dropout(inputs, self.rate, seed=tf.stack([self.seed * 4096 + replica, calls]))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


def mlp_layers(config: ModelConfig, data: DataSpec) -> list[keras.layers.Layer]:
    """The mlp's layers (on the flat pixels, whatever the images' shape)."""
    return [*(keras.layers.Dense(units, activation="relu") for units in config.hidden_units),
            StepSeededDropout(config.dropout), _probabilities(data)]


def cnn_layers(config: ModelConfig, data: DataSpec) -> list[keras.layers.Layer]:
    """Keras's Simple MNIST convnet's layers, on the images' own shape."""
    return [
        keras.layers.Reshape(data.shape, name="image"),
        keras.layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        keras.layers.MaxPooling2D(pool_size=(2, 2)),
        keras.layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        keras.layers.MaxPooling2D(pool_size=(2, 2)),
        keras.layers.Flatten(),
        StepSeededDropout(config.dropout),
        _probabilities(data),
    ]


def _probabilities(data: DataSpec) -> keras.layers.Layer:
    return keras.layers.Dense(data.classes, activation="softmax", dtype="float32", name="probabilities")


def weighted(stack: list[keras.layers.Layer], data: DataSpec) -> list[bool]:
    """Which layers of ``stack`` hold weights: the ones a layer split places (a probe builds clones of them)."""
    shape: tuple = (None, data.features)
    found = []
    for layer in stack:
        probe = layer.__class__.from_config(layer.get_config())
        probe.build(shape)
        found.append(bool(probe.trainable_weights))
        shape = probe.compute_output_shape(shape)
    return found


def resolve_builder(builder: str) -> Callable[..., Any]:
    """The function ``model.builder`` names, imported from the workspace (or the installed packages).

    Raises:
        InputError: the module does not import, or has no callable of that name.
    """
    module_name, _, function_name = builder.partition(":")
    root = str(workspace_root())
    if root not in sys.path:  # the stages run as scripts: the workspace is not on the path by itself
        sys.path.insert(0, root)
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001  ImportError, or whatever the module raises as it runs
        raise InputError(f"model.builder {builder!r}: cannot import {module_name} ({type(err).__name__}: {err}); "
                         f"put it in the workspace ({Path(root).name}/) or install it") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        what = "has no" if function is None else f"has a {type(function).__name__}, not a function, named"
        raise InputError(f"model.builder {builder!r}: {module_name} {what} {function_name}; "
                         "name a function(input_shape, classes) that returns a Keras model")
    return function


def user_layers(config: ModelConfig, data: DataSpec) -> list[keras.layers.Layer]:
    """The user's model after the pixels' reshape: its layers (a Sequential's, cloned fresh) or itself as one layer."""
    model = _call_builder(config.builder, data)
    image = keras.layers.Reshape(data.shape, name="image")
    if isinstance(model, keras.Sequential):
        layers = [layer.__class__.from_config(layer.get_config()) for layer in model.layers]
    else:
        layers = [model]
    return [image, *layers, keras.layers.Activation("linear", dtype="float32", name="float32_output")]


def _call_builder(builder: str, data: DataSpec) -> keras.Model:
    """The model ``builder`` returns for ``data``, checked: a Keras model giving one probability per class.

    Raises:
        InputError: the builder raised, returned something else, or its output is not K probabilities.
    """
    function = resolve_builder(builder)
    shape, classes = data.shape, data.classes
    try:
        model = function(shape, classes)
    except Exception as err:  # noqa: BLE001  the user's code: say where, in one line
        raise InputError(f"model.builder {builder!r} raised {type(err).__name__}: {err}") from None
    if not isinstance(model, keras.Model):
        hint = " (a Keras 3 model: build it with tf_keras, `import tf_keras as keras`)" if "keras" in type(
            model).__module__ else ""
        raise InputError(f"model.builder {builder!r} returned a {type(model).__module__}.{type(model).__name__}, "
                         f"not a tf_keras Model{hint}")
    try:
        out = np.asarray(model(np.zeros((2, *shape), dtype=np.float32), training=False), dtype=np.float64)
    except Exception as err:  # noqa: BLE001
        raise InputError(f"model.builder {builder!r}: its model does not take input of shape "
                         f"(None, {', '.join(map(str, shape))}), {data.name}'s images "
                         f"({type(err).__name__}: {str(err).strip().splitlines()[0]})") from None
    if out.shape != (2, classes):
        raise InputError(f"model.builder {builder!r}: its output has shape (None, {', '.join(map(str, out.shape[1:]))}); "
                         f"it must give one probability per class of {data.name}: (None, {classes})")
    if not (np.all(out >= 0) and np.allclose(out.sum(axis=1), 1.0, atol=1e-3)):
        raise InputError(f"model.builder {builder!r}: its outputs are not probabilities (they sum to "
                         f"{out.sum(axis=1)[0]:.3g}); end the model in Dense({classes}, activation='softmax')")
    return model
