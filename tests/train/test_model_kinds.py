"""Model kinds are records, as strategies are: one record in tfdist/model_kinds.py, one function of layers, and
nothing else names a kind."""

import ast
from dataclasses import replace

import pytest

from tfdist import model_kinds
from tfdist.config.knobs import ConfigError, ModelConfig
from tfdist.config.params import load_config
from tfdist.errors import InputError
from tfdist.model_kinds import KINDS, model_kind
from tfdist.runtime.onednn import onednn_enabled
from tfdist.runtime.threads import intra_op_threads
from tfdist.train.architectures import layer_stack, weighted
from tfdist.train.checks import layers_with_weights, too_few_layers

from helpers.digits import MNIST
from helpers.project import REPO, tiny_params


def test_no_module_but_the_record_names_a_kind():
    offenders = []
    for path in sorted((REPO / "src" / "tfdist").rglob("*.py")):
        if path.name == "model_kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in KINDS:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}")
    assert not offenders, offenders


def test_every_record_names_a_function_of_layers_and_counts_its_weighted_layers_before_tensorflow():
    for kind in KINDS.values():
        if kind.takes_builder:
            continue
        config = ModelConfig(kind=kind.name)
        assert layers_with_weights(config) == sum(weighted(layer_stack(config, MNIST), MNIST)), kind.name


def test_adding_a_kind_is_one_record(monkeypatch, tmp_path):
    wide = replace(KINDS["mlp"], name="wide", threads_per_op="share", onednn=True, split_hint="")
    monkeypatch.setitem(model_kinds.KINDS, "wide", wide)
    params = tiny_params(tmp_path, model={"kind": "wide", "hidden_units": [256, 256]})
    config = load_config(params).model
    assert config.kind == "wide"
    assert layers_with_weights(config) == 3 == sum(weighted(layer_stack(config, MNIST), MNIST))
    assert onednn_enabled("auto", "wide") is True and intra_op_threads("auto", "wide", replicas=1) >= 1
    assert "model.hidden_units [256, 256] and the output" in str(too_few_layers(config, 4, 3))


def test_an_unknown_kind_is_refused_naming_the_kinds(tmp_path):
    with pytest.raises(ConfigError, match="model.kind must be one of mlp, cnn, builder; got 'rnn'"):
        load_config(tiny_params(tmp_path, model={"kind": "rnn"}))
    with pytest.raises(InputError, match="model.kind 'rnn' is not a kind of model; choose one of mlp, cnn, builder"):
        model_kind("rnn")


def test_the_runtime_defaults_follow_the_record():
    assert onednn_enabled("auto", "mlp") is False and onednn_enabled("auto", "cnn") is True
    assert intra_op_threads("auto", "mlp", replicas=1) == 1
    assert onednn_enabled("enabled", "mlp") is True and onednn_enabled("tensorflow", "cnn") is None
