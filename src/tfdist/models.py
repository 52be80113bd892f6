"""The seed model: the MLP the comparison trains under every strategy."""

from __future__ import annotations

from tfdist.config import ModelConfig, TrainConfig
from tfdist.data import CLASSES, PIXELS
from tfdist.runtime import keras

_OPTIMIZERS = {
    "adam": keras.optimizers.Adam,
    "sgd": keras.optimizers.SGD,
    "rmsprop": keras.optimizers.RMSprop,
}


def build_seed_model(config: ModelConfig) -> keras.Model:
    """784 -> Dense(relu) per ``hidden_units`` -> Dropout -> Dense(10, softmax).

    Call inside ``strategy.scope()`` so the variables are created by the strategy.
    """
    layers = [keras.Input(shape=(PIXELS,), name="pixels")]
    layers += [keras.layers.Dense(units, activation="relu") for units in config.hidden_units]
    layers += [keras.layers.Dropout(config.dropout), keras.layers.Dense(CLASSES, activation="softmax")]
    return keras.Sequential(layers, name="seed_mlp")


def compile_model(model: keras.Model, config: TrainConfig, learning_rate: float) -> None:
    """Attach optimizer, loss and accuracy; also inside ``strategy.scope()``."""
    model.compile(
        optimizer=_OPTIMIZERS[config.optimizer](learning_rate=learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        steps_per_execution=config.steps_per_execution,
    )
