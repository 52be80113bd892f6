"""The custom training loop, gradient clipping and mixed precision.

In-process strategies only: the multi-process ones are exercised in
test_multi_process.py.
"""

import numpy as np
import pytest

from tfdist.config.params import load_config
from tfdist.data.prepared import load_split, scaled
from tfdist.distribute.builders import build_strategy
from tfdist.distribute.registry import get_spec
from tfdist.errors import InputError
from tfdist.tf_imports import keras, tf
from tfdist.train import precision
from tfdist.train.checks import check_precision
from tfdist.train.fit import train_model
from tfdist.train.models import build_model, compile_model, trained_weights

from helpers.digits import MNIST
from helpers.project import tiny_params


def train(tmp_path, prepared_dir, strategy="default", **train_section):
    config = load_config(tiny_params(tmp_path, train=train_section))
    spec = get_spec(strategy)
    strategy, info = build_strategy(spec, config.distributed.devices)
    return train_model(config, spec, strategy, info, data=MNIST, train=load_split(prepared_dir, "train", MNIST),
                         val=load_split(prepared_dir, "val", MNIST))


def accuracy_on_test(result, prepared_dir):
    test = load_split(prepared_dir, "test", MNIST).read()
    return float(np.mean(result.model.predict(scaled(test.x), verbose=0).argmax(axis=1) == test.y))


def test_the_custom_loop_learns_as_well_as_fit(tmp_path, prepared_dir):
    accuracy = {loop: accuracy_on_test(train(tmp_path, prepared_dir, epochs=3, loop=loop), prepared_dir)
                for loop in ("fit", "custom")}
    assert accuracy["fit"] > 0.85
    assert abs(accuracy["custom"] - accuracy["fit"]) <= 0.02, accuracy


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_each_step_function_is_traced_once_over_an_epoch(tmp_path, prepared_dir, loop):
    # 3,600 digits / 32 = 112 steps: the last call into the runtime runs 12 of its 20 steps.
    result = train(tmp_path, prepared_dir, epochs=2, loop=loop, steps_per_execution=20)
    assert result.traces["train"] == 1
    assert result.traces["test"] >= 1


def test_the_custom_loop_reports_gradient_norms_per_epoch(tmp_path, prepared_dir):
    result = train(tmp_path, prepared_dir, epochs=2, loop="custom")
    for row in result.history:
        assert 0 < row["gradient_norm"] <= row["gradient_norm_max"]
        assert row["nonfinite_steps"] == 0
    assert "val_gradient_norm" not in result.history[0], "test steps report loss and accuracy only"


def one_sgd_step(params, loop, method, value=0.05):
    """The weight update of one SGD step with learning rate 1: minus the applied (clipped) gradient."""
    config = load_config(params, ["train.optimizer=sgd", "train.learning_rate=1.0", "train.steps_per_execution=1",
                                  f"train.clip.method={method}", f"train.clip.value={value}"])
    keras.utils.set_random_seed(3)
    model = build_model(config.model, MNIST, loop)
    compile_model(model, config.train, config.train.learning_rate)
    x = np.random.default_rng(0).random((64, 784), dtype=np.float32)
    y = np.arange(64) % 10
    before = trained_weights(model)
    model.train_on_batch(x, y)
    return [b - a for b, a in zip(before, trained_weights(model), strict=True)]


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_clipping_bounds_the_applied_update_for_each_method(params_file, loop):
    unclipped = one_sgd_step(params_file, loop, "none")
    assert np.sqrt(sum(np.sum(u ** 2) for u in unclipped)) > 0.05, "the test needs gradients above the clip"

    update = one_sgd_step(params_file, loop, "global_norm")
    assert np.sqrt(sum(np.sum(u ** 2) for u in update)) == pytest.approx(0.05, rel=1e-3)

    update = one_sgd_step(params_file, loop, "norm")
    assert max(np.linalg.norm(u) for u in update) <= 0.05 * (1 + 1e-4)
    assert max(np.linalg.norm(u) for u in unclipped) > 0.05

    update = one_sgd_step(params_file, loop, "value")
    assert max(np.abs(u).max() for u in update) <= 0.05 * (1 + 1e-6)
    assert max(np.abs(u).max() for u in unclipped) > 0.05


def test_policies_do_not_leak_between_models(params_file):
    model_config = load_config(params_file).model
    before = keras.mixed_precision.global_policy().name
    with precision.policy("mixed_float16"):
        mixed = build_model(model_config, MNIST, "custom")
    plain = build_model(model_config, MNIST, "custom")
    assert len(trained_weights(mixed)) == 4, "two Dense layers; the gradient-norm metrics are not parameters"
    assert keras.mixed_precision.global_policy().name == before
    assert mixed.stack[0].compute_dtype == "float16" and mixed.stack[0].variable_dtype == "float32"
    assert mixed.stack[-1].compute_dtype == "float32", "the output layer stays float32"
    assert mixed(np.zeros((2, 784), np.float32)).dtype == tf.float32
    assert all(v.dtype == tf.float32 for v in mixed.weights if v.dtype.is_floating), "the dropout's step counter aside"
    assert plain.stack[0].compute_dtype == "float32"


def test_mixed_float16_recovers_from_a_huge_initial_loss_scale(tmp_path, prepared_dir):
    config = load_config(tiny_params(tmp_path, train={"precision": "mixed_float16", "loop": "custom"}))
    with precision.policy("mixed_float16"):
        model = build_model(config.model, MNIST, "custom")
        optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam(1e-3), initial_scale=2.0 ** 40)
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(),
                      metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")], steps_per_execution=10)
    train_split = load_split(prepared_dir, "train", MNIST).read()
    history = model.fit(scaled(train_split.x), train_split.y, batch_size=32, epochs=2, verbose=0).history
    assert history["nonfinite_steps"][0] >= 10, "overflowing steps were counted"
    assert float(optimizer.loss_scale) < 2.0 ** 30, "each overflow halved the loss scale"
    assert all(np.isfinite(w).all() for w in trained_weights(model)), "skipped steps were not applied"
    assert history["accuracy"][-1] > 0.8 and history["nonfinite_steps"][-1] < 5


def test_mixed_float16_with_clipping_trains_under_mirrored(tmp_path, prepared_dir):
    result = train(tmp_path, prepared_dir, "mirrored", epochs=2, loop="custom", precision="mixed_float16",
                   clip={"method": "global_norm", "value": 1.0})
    assert result.history[-1]["val_accuracy"] > 0.8
    assert result.history[-1]["gradient_norm"] > 0


@pytest.mark.parametrize(("strategy", "loop", "precision_name"), [
    ("central_storage", "custom", "mixed_bfloat16"),
    ("one_device", "fit", "mixed_float16"),
    ("mirrored", "fit", "mixed_bfloat16"),
])
def test_other_combinations_train(tmp_path, prepared_dir, strategy, loop, precision_name):
    result = train(tmp_path, prepared_dir, strategy, epochs=2, loop=loop, precision=precision_name,
                   clip={"method": "value", "value": 0.5})
    assert result.history[-1]["val_accuracy"] > 0.75


@pytest.mark.parametrize("strategy", ["central_storage", "parameter_server"])
def test_mixed_float16_is_refused_where_loss_scaling_is_unsupported(strategy):
    with pytest.raises(InputError, match=f"train.precision mixed_float16 needs loss scaling, .* not {strategy}"):
        check_precision(get_spec(strategy), "mixed_float16")
    check_precision(get_spec(strategy), "mixed_bfloat16")


def test_hardware_support_names_what_is_missing(monkeypatch):
    float16 = precision.hardware_support("mixed_float16")
    assert not float16.can_be_faster and "this machine has no GPU" in float16.reason
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "avx512f"})
    bfloat16 = precision.hardware_support("mixed_bfloat16")
    assert not bfloat16.can_be_faster and "a CPU without them" in bfloat16.reason
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    assert precision.hardware_support("mixed_bfloat16").can_be_faster
    assert precision.hardware_support("float32").can_be_faster


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n")
    assert precision.cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16"}
    assert precision.cpu_flags(tmp_path / "missing") == set()


def test_a_precision_that_cannot_be_faster_is_warned_of_and_float16_on_a_cpu_says_it_is_slower(caplog):
    with caplog.at_level("WARNING", logger="tfdist.train.precision"):
        found = precision.announce("mixed_float16")
    assert not found.can_be_faster or tf.config.list_physical_devices("GPU")
    if not tf.config.list_physical_devices("GPU"):
        assert "many times slower than float32" in caplog.text and "Training runs anyway" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tfdist.train.precision"):
        precision.announce("float32")
    assert not caplog.text, "float32 is the baseline: nothing to warn of"
