"""The seed model: the MLP the comparison trains under every strategy."""

from __future__ import annotations

from typing import Any

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


def compile_model(model: keras.Model, config: TrainConfig, learning_rate: Any, **options: Any) -> None:
    """Attach optimizer, loss and accuracy; also inside ``strategy.scope()``.

    ``learning_rate`` is a float or a Keras learning-rate schedule; ``options``
    go to ``compile`` as they are (e.g. ``pss_evaluation_shards``).
    """
    model.compile(
        optimizer=_OPTIMIZERS[config.optimizer](learning_rate=learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        steps_per_execution=config.steps_per_execution,
        **options,
    )


def export_copy(model: keras.Model, config: ModelConfig) -> keras.Model:
    """The trained weights in a fresh model built outside any strategy.

    What gets saved and evaluated: it loads anywhere, and predicting with it
    needs no other worker (under MultiWorkerMirrored, ``predict`` on the
    distributed model is a collective every worker must join).
    """
    copy = build_seed_model(config)
    copy.set_weights(model.get_weights())
    return copy
