"""Model and pipeline parallelism through the train stage: what a step holds and moves, and the refusals."""

import json

import pytest
from click.testing import CliRunner

from stages import evaluate, train
from tfdist.config.params import load_config

from helpers.devices import TWO_DEVICES
from helpers.digits import MNIST
from helpers.project import tiny_params


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
    assert report["replicas"] == 1 and report["devices"] == TWO_DEVICES and report["val_accuracy"] > 0.8
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
     "error: distributed.devices 3 > the 2 layer(s) with weights of the model (model.hidden_units [128] and the output)"),
    (["--strategy", "model_parallel", "--set", "train.jit_compile=true"],
     "error: train.jit_compile true: XLA compiles a step for one device"),
])
def test_a_combination_a_split_cannot_train_exits_2_saying_why(workdir, sets, message):
    result = invoke(*sets, "--name", "x")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith(message)
    assert not (workdir / "models").exists()


def test_mixed_precision_activations_count_half_the_bytes(workdir):
    from tfdist.train.models import build_model
    from tfdist.train.step_costs import _activation_bytes

    config = load_config(workdir / "params.yaml", ("model.hidden_units=[64]", "train.precision=mixed_bfloat16"))
    model = build_model(config.model, MNIST, "custom", list(TWO_DEVICES))
    assert _activation_bytes(config, MNIST, model, 32) == 2 * 32 * 64 * 2, "the hidden layer's output crosses, both ways"
    cnn = load_config(workdir / "params.yaml", ("model.kind=cnn",))
    model = build_model(cnn.model, MNIST, "custom", list(TWO_DEVICES))
    assert _activation_bytes(cnn, MNIST, model, 32) == 2 * 32 * (5 * 5 * 64) * 4, "the second pooling's output crosses"
