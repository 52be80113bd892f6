"""Model and pipeline parallelism: the same math as one device, the stage, the costs, the refusals."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from stages import evaluate, train
from tfdist.config import ModelConfig, load_config
from tfdist.models import DigitClassifier, PipelineClassifier, build_model
from tfdist.placement import device_of, stage_of_layers
from tfdist.runtime import keras
from tfdist.strategies import StrategyError, get_spec, make_strategy

from conftest import HAS_GPU, LOGICAL_CPUS, cpu_only, tiny_params

DEVICES = ["/gpu:0", "/gpu:1"] if HAS_GPU else [f"/cpu:{i}" for i in range(LOGICAL_CPUS)]
MODEL = ModelConfig(hidden_units=[32, 16], dropout=0.0)  # no dropout: the steps must agree exactly


def batch(size=24, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((size, 784), dtype=np.float32), rng.integers(0, 10, size)


def one_sgd_step(model, x, y):
    """One optimizer step (plain SGD, learning rate 1: the weights move by minus the gradient); the loss."""
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=1.0), loss=keras.losses.SparseCategoricalCrossentropy())
    loss = model.train_on_batch(x, y)
    return loss, [v.numpy() for v in model.trainable_variables]


def test_layers_are_cut_into_contiguous_stages_as_even_as_possible():
    assert stage_of_layers(2, 2) == [0, 1] and stage_of_layers(3, 2) == [0, 0, 1] and stage_of_layers(5, 3) == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError):
        stage_of_layers(2, 3)


@pytest.mark.skipif(not HAS_GPU and LOGICAL_CPUS < 2, reason="needs two devices")
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_model_parallel_puts_layers_on_two_devices_and_steps_like_one_device(loop):
    keras.utils.set_random_seed(3)
    whole = build_model(MODEL, loop)
    split = build_model(MODEL, loop, DEVICES)
    split.set_weights(whole.get_weights())
    assert [device_of(v) for v in split.trainable_variables] == [DEVICES[0]] * 4 + [DEVICES[1]] * 2
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
    pipelined = PipelineClassifier(MODEL, DEVICES, micro_batches)
    pipelined.build((None, 784))
    pipelined.set_weights(whole.get_weights())
    x, y = batch()
    (loss_whole, after_whole), (loss_piped, after_piped) = one_sgd_step(whole, x, y), one_sgd_step(pipelined, x, y)
    assert loss_piped == pytest.approx(loss_whole, rel=1e-5)
    for a, b in zip(after_whole, after_piped, strict=True):
        np.testing.assert_allclose(b, a, atol=2e-6, rtol=1e-5)  # the same sum, added in another order


def invoke(*args):
    return CliRunner().invoke(train.main, [str(a) for a in args])


@pytest.fixture
def workdir(tmp_path, monkeypatch, prepared_copy):
    monkeypatch.chdir(tmp_path)
    tiny_params(tmp_path, distributed={"micro_batches": 4})
    return tmp_path


@pytest.mark.parametrize(("strategy", "loop", "micro_batches"), [("model_parallel", "fit", 1),
                                                                   ("pipeline_parallel", "custom", 4)])
def test_the_train_stage_trains_a_split_model_and_reports_what_it_costs(workdir, strategy, loop, micro_batches):
    result = invoke("--strategy", strategy, "--name", strategy, "--set", f"train.loop={loop}",
                    "--set", "model.hidden_units=[64]")
    assert result.exit_code == 0, result.output
    report = json.loads((workdir / "reports" / "train" / f"{strategy}.json").read_text())
    assert report["paradigm"] == {"model_parallel": "model", "pipeline_parallel": "pipeline"}[strategy]
    assert report["replicas"] == 1 and report["devices"] == DEVICES and report["val_accuracy"] > 0.8
    assert report["params_per_device"] == [784 * 64 + 64, 64 * 10 + 10], "the hidden layer, then the output layer"
    assert report["bytes_per_step"] == 2 * 32 * 64 * 4, "64 activations per example forward, their gradients back"
    assert (report["stages"], report["micro_batches"]) == (2, micro_batches)
    assert report["bubble_theory"] == pytest.approx(1 / (micro_batches + 1))
    assert 0.0 <= report["bubble"] <= 1.0
    assert (workdir / "models" / strategy / "MLmodel").is_file()
    evaluated = CliRunner().invoke(evaluate.main, ["--name", strategy])
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads((workdir / "reports" / "eval" / f"{strategy}.json").read_text())["accuracy"] > 0.8


@pytest.mark.parametrize(("sets", "message"), [
    (["--strategy", "pipeline_parallel", "--set", "train.loop=fit"],
     "error: strategy pipeline_parallel needs train.loop custom, not fit"),
    (["--strategy", "pipeline_parallel", "--set", "train.loop=custom", "--set", "distributed.micro_batches=5"],
     "error: distributed.micro_batches 5 does not divide train.batch_size 32"),
    (["--strategy", "model_parallel", "--set", "distributed.devices=3"],
     "error: distributed.devices 3 > the 2 layers of the model (model.hidden_units [128] and the output)"),
    (["--strategy", "model_parallel", "--set", "train.jit_compile=true"],
     "error: train.jit_compile true: XLA compiles a step for one device"),
])
def test_a_combination_a_split_cannot_train_exits_2_saying_why(workdir, sets, message):
    result = invoke(*sets, "--name", "x")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith(message)
    assert not (workdir / "models").exists()


def test_the_registry_knows_three_paradigms():
    assert {get_spec(name).paradigm for name in ("mirrored", "model_parallel", "pipeline_parallel")} == {
        "data", "model", "pipeline"}
    assert get_spec("pipeline_parallel").loops == ("custom",)


@cpu_only
def test_nccl_all_reduce_needs_gpus():
    with pytest.raises(StrategyError, match="distributed.all_reduce nccl needs a GPU on every worker"):
        make_strategy("multi_worker_mirrored", all_reduce="nccl")


def test_all_reduce_is_a_knob_with_three_values(tmp_path):
    config = load_config(tiny_params(tmp_path), ("distributed.all_reduce=ring",))
    assert config.distributed.all_reduce == "ring"
    with pytest.raises(Exception, match="distributed.all_reduce must be one of auto, ring, nccl"):
        load_config(tiny_params(tmp_path), ("distributed.all_reduce=horovod",))


def test_mixed_precision_activations_count_half_the_bytes(workdir):
    from tfdist.parallelism import _activation_bytes

    config = load_config(workdir / "params.yaml", ("model.hidden_units=[64]", "train.precision=mixed_bfloat16"))
    assert _activation_bytes(config, 2, 32) == 2 * 32 * 64 * 2
