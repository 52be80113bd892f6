"""One fit under a strategy: it learns, refuses a batch larger than the data, stops on NaN, scales the rate."""

import time

import numpy as np
import pytest

from tfdist.compare.advice import INPUT_BOUND
from tfdist.config.params import load_config
from tfdist.data.input_pipeline import make_dataset, make_dataset_fn
from tfdist.data.prepared import load_split, scaled
from tfdist.distribute.builders import StrategyInfo, build_strategy
from tfdist.distribute.registry import get_spec
from tfdist.errors import InputError
from tfdist.records.history import EPOCH_COLUMNS
from tfdist.tf_imports import keras, tf
from tfdist.train import fit
from tfdist.train.callbacks import Diverged, LinearWarmup
from tfdist.train.fit import FitPlan, effective_learning_rate, train_model

from helpers.devices import SPLIT_REPLICAS
from helpers.digits import MNIST
from helpers.project import tiny_params


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))


@pytest.mark.parametrize("strategy_name", ["default", "one_device", "mirrored", "central_storage"])
def test_training_on_the_sample_learns(tmp_path, prepared_dir, strategy_name):
    config = load_config(tiny_params(tmp_path))
    spec = get_spec(strategy_name)
    strategy, info = build_strategy(spec, config.distributed.devices)
    recorder = Recorder()
    result = train_model(config, spec, strategy, info, data=MNIST, train=load_split(prepared_dir, "train", MNIST),
                         val=load_split(prepared_dir, "val", MNIST), callbacks=[recorder])
    test = load_split(prepared_dir, "test", MNIST).read()
    accuracy = float(np.mean(result.model.predict(scaled(test.x), verbose=0).argmax(axis=1) == test.y))
    assert accuracy > 0.8, "two epochs on 3,600 real digits reach well above chance (0.1)"
    assert info.replicas == (SPLIT_REPLICAS if strategy_name in ("mirrored", "central_storage") else 1)
    assert result.global_batch_size == 32 * info.replicas
    assert result.steps_per_epoch == 3600 // result.global_batch_size
    assert [row["epoch"] for row in result.history] == [1, 2]
    assert set(EPOCH_COLUMNS) <= set(result.history[-1])
    # the timer runs before user callbacks, so trackers see the timing of each epoch
    assert all(row["samples_per_second"] > 0 for row in recorder.epochs)
    assert result.steady_epoch_seconds == result.history[1]["epoch_seconds"], "two epochs: the second is steady"
    assert result.first_epoch_overhead_seconds == pytest.approx(
        max(0.0, result.history[0]["epoch_seconds"] - result.steady_epoch_seconds))
    assert 0 < result.startup_seconds < 3600, "seconds from process start to fit"
    if info.replicas == 1:
        assert 0 <= result.input_share < 1 and all("input_share" in row for row in result.history), "timed each step"
    else:
        assert result.input_share is None and not any("input_share" in row for row in result.history), "not timed"


def test_each_validation_reads_every_validation_digit_once_from_its_endless_input(tmp_path, prepared_dir):
    # Over two replicas the global batch is 64: the 400 validation digits end in a partial batch of 16.
    config = load_config(tiny_params(tmp_path))
    spec = get_spec("mirrored")
    strategy, info = build_strategy(spec, config.distributed.devices)
    val = load_split(prepared_dir, "val", MNIST)
    result = train_model(config, spec, strategy, info, data=MNIST, train=load_split(prepared_dir, "train", MNIST), val=val)
    assert len(val) % result.global_batch_size == 16
    plan = FitPlan.of(config, spec, info, 3600, len(val))
    assert (plan.val_steps, plan.shards) == (7, 0)
    held = val.read()
    loss, accuracy = result.model.evaluate(scaled(held.x), held.y, batch_size=result.global_batch_size, verbose=0)
    last = result.history[-1]
    assert (last["val_loss"], last["val_accuracy"]) == (pytest.approx(loss, rel=1e-6), pytest.approx(accuracy)), \
        "the last epoch's validation is a finite pass over the same digits"


def test_parameter_server_validates_exactly_in_one_shard_per_worker(tmp_path):
    config = load_config(tiny_params(tmp_path, train={"batch_size": 32}))
    spec = get_spec("parameter_server")
    info = StrategyInfo("parameter_server", "ParameterServerStrategy", 1, workers=3, ps=1, synchronous=False)
    plan = FitPlan.of(config, spec, info, 3600, 400)
    assert (plan.shards, plan.val_batch, plan.val_steps) == (3, 32, None), "finite shards, read to their ends"
    few = FitPlan.of(config, spec, info, 3600, 40)
    assert (few.shards, few.val_batch) == (3, 13), "at least one batch for every shard"


def test_batch_larger_than_the_data_is_refused(tmp_path, prepared_dir):
    config = load_config(tiny_params(tmp_path, train={"batch_size": 100_000}))
    spec = get_spec("default")
    strategy, info = build_strategy(spec)
    with pytest.raises(InputError, match="exceeds the 3600 training images; lower train.batch_size"):
        train_model(config, spec, strategy, info, data=MNIST, train=load_split(prepared_dir, "train", MNIST),
                         val=load_split(prepared_dir, "val", MNIST))


def test_a_nan_loss_stops_training_at_once_naming_epoch_and_step(tmp_path, prepared_dir):
    config = load_config(tiny_params(tmp_path, train={"optimizer": "sgd", "learning_rate": 1e30, "epochs": 5}))
    spec = get_spec("default")
    strategy, info = build_strategy(spec)
    recorder = Recorder()
    with pytest.raises(Diverged, match=r"training diverged: loss is (nan|inf) at epoch 1 \(step 112\); "
                                       r"lower train.learning_rate or clip gradients") as raised:
        train_model(config, spec, strategy, info, data=MNIST, train=load_split(prepared_dir, "train", MNIST),
                    val=load_split(prepared_dir, "val", MNIST), callbacks=[recorder])
    assert (raised.value.epoch, raised.value.step, raised.value.exit_code) == (1, 112, 1)
    assert recorder.epochs == [], "callbacks after the guard (trackers, backups) never see a diverged epoch"


def test_each_pipeline_streams_files_of_its_own_epoch_by_epoch(prepared_dir):
    """Two input pipelines read disjoint halves of the images, each epoch in an order of its own; a run resumed at
    epoch 1 reads what the uninterrupted run read in its epoch 1."""
    train = load_split(prepared_dir, "train", MNIST)
    steps = len(train) // 2 // 25
    fn = make_dataset_fn(train, 50, seed=1, steps=steps, pipelines=2)
    seen, epochs = [], []
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)
        batches = list(fn(context).take(2 * steps).as_numpy_iterator())
        seen.append({x.tobytes() for xb, _ in batches[:steps] for x in xb})
        epochs.append([xb.tobytes() for xb, _ in batches])
    assert seen[0] and seen[1] and not seen[0] & seen[1], "each pipeline reads its own files"
    assert np.isclose(len(seen[0]), len(train) / 2, rtol=0.05)
    assert epochs[0][:steps] != epochs[0][steps:], "every epoch is reshuffled"
    resumed = make_dataset_fn(train, 50, seed=1, steps=steps, pipelines=2, start_epoch=1)
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0, num_replicas_in_sync=2)
    assert [xb.tobytes() for xb, _ in resumed(context).take(steps).as_numpy_iterator()] == epochs[0][steps:]


@pytest.mark.parametrize(("scaling", "expected"), [("none", 0.001), ("linear", 0.004)])
def test_linear_scaling_multiplies_the_rate_by_global_over_per_replica_batch(tmp_path, scaling, expected):
    config = load_config(tiny_params(tmp_path, train={"learning_rate": 0.001, "batch_size": 32, "lr_scaling": scaling}))
    assert effective_learning_rate(config.train, global_batch_size=128) == pytest.approx(expected)


def test_warmup_ramps_linearly_then_holds():
    schedule = LinearWarmup(0.01, warmup_steps=4)
    rates = [float(schedule(tf.constant(step))) for step in range(6)]
    assert rates == pytest.approx([0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01])


def test_scaled_rate_and_warmup_reach_the_optimizer_under_mirrored(tmp_path, prepared_dir):
    config = load_config(tiny_params(tmp_path, train={"epochs": 2, "lr_scaling": "linear", "warmup_epochs": 0.5}))
    spec = get_spec("mirrored")
    strategy, info = build_strategy(spec, config.distributed.devices)
    result = train_model(config, spec, strategy, info, data=MNIST, train=load_split(prepared_dir, "train", MNIST),
                         val=load_split(prepared_dir, "val", MNIST))
    assert result.learning_rate == pytest.approx(0.001 * info.replicas)
    assert result.warmup_steps == round(0.5 * result.steps_per_epoch)
    optimizer = result.model.optimizer
    rate = optimizer.learning_rate
    rate = rate(optimizer.iterations) if callable(rate) else rate  # the schedule's value at the last step
    rate = float(rate.numpy() if hasattr(rate, "numpy") else rate)
    assert rate == pytest.approx(result.learning_rate), "warm-up is over: the scaled rate is reached"
    assert result.history[-1]["val_accuracy"] > 0.8


def test_an_input_slowed_on_purpose_is_reported_input_bound_and_a_normal_one_is_not(tmp_path, prepared_dir, monkeypatch):
    config = load_config(tiny_params(tmp_path, model={"kind": "cnn"}))
    spec = get_spec("default")
    strategy, info = build_strategy(spec, config.distributed.devices)
    train, val = load_split(prepared_dir, "train", MNIST), load_split(prepared_dir, "val", MNIST)
    normal = train_model(config, spec, strategy, info, data=MNIST, train=train, val=val)

    def sleeping(*args, **kwargs):  # every batch 60 ms late, one after another: twice a step on a machine loaded 3x
        def late(x, y):
            with tf.control_dependencies([tf.py_function(lambda: time.sleep(0.06), [], [])]):
                return tf.identity(x), tf.identity(y)
        return make_dataset(*args, **kwargs).map(late)

    monkeypatch.setattr(fit, "make_dataset", sleeping)
    slowed = train_model(config, spec, strategy, info, data=MNIST, train=train, val=val)
    assert slowed.input_share > 0.4, (slowed.input_share, slowed.steady_epoch_seconds, normal.steady_epoch_seconds)
    assert normal.input_share < INPUT_BOUND, (normal.input_share, normal.history)
