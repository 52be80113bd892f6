import math

import numpy as np
import pytest

from tfdist.config import load_config
from tfdist.data import load_split
from tfdist.errors import InputError, RunError
from tfdist.runtime import keras
from tfdist.strategies import make_strategy
from tfdist.training import EPOCH_COLUMNS, DivergenceGuard, train_model

from conftest import tiny_params


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_training_on_the_sample_learns(tmp_path, prepared_dir, strategy_name):
    config = load_config(tiny_params(tmp_path))
    strategy, info = make_strategy(strategy_name, config.distributed.devices)
    recorder = Recorder()
    result = train_model(config, strategy, info, load_split(prepared_dir, "train"), load_split(prepared_dir, "val"),
                         [recorder])
    test = load_split(prepared_dir, "test")
    accuracy = float(np.mean(result.model.predict(test.x, verbose=0).argmax(axis=1) == test.y))
    assert accuracy > 0.8, "two epochs on 3,600 real digits reach well above chance (0.1)"
    assert result.global_batch_size == 32 * info.replicas
    assert result.steps_per_epoch == 3600 // result.global_batch_size
    assert [row["epoch"] for row in result.history] == [1, 2]
    assert set(EPOCH_COLUMNS) <= set(result.history[-1])
    # the timer runs before user callbacks, so trackers see the timing of each epoch
    assert all(row["samples_per_second"] > 0 for row in recorder.epochs)


def test_batch_larger_than_the_data_is_refused(tmp_path, prepared_dir):
    config = load_config(tiny_params(tmp_path, train={"batch_size": 100_000}))
    strategy, info = make_strategy("default")
    with pytest.raises(InputError, match="exceeds the 3600 training digits; lower train.batch_size"):
        train_model(config, strategy, info, load_split(prepared_dir, "train"), load_split(prepared_dir, "val"))


def test_divergence_stops_with_a_hint():
    with pytest.raises(RunError, match="loss is nan at epoch 3; lower train.learning_rate"):
        DivergenceGuard().on_epoch_end(2, {"loss": math.nan})
    DivergenceGuard().on_epoch_end(0, {"loss": 0.5})
