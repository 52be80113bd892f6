from pathlib import Path

import pytest

from tfdist.config import DISTRIBUTED_STRATEGIES, Config, ConfigError, load_config, parse_override, to_flat_dict
from tfdist.strategies import STRATEGY_NAMES

from conftest import REPO


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_repo_params_match_the_documented_defaults():
    config = load_config(REPO / "params.yaml")
    assert config.train.batch_size == 25 and config.train.epochs == 10
    assert config.model.hidden_units == [128] and config.model.dropout == 0.2
    assert config.mlflow.tracking_uri == "sqlite:///mlruns/mlflow.db"
    assert config.distributed.devices == 2


def test_empty_file_gives_dataclass_defaults(tmp_path):
    assert load_config(write(tmp_path, "")) == Config()


def test_overrides_are_yaml_typed(tmp_path):
    config = load_config(write(tmp_path, "train: {epochs: 5}\n"), ["train.epochs=3", "model.hidden_units=[64, 32]",
                                                                    "train.learning_rate=1e-2"])
    assert config.train.epochs == 3
    assert config.model.hidden_units == [64, 32]
    assert config.train.learning_rate == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("text", "overrides", "message"),
    [
        ("train: {epoch: 3}\n", [], "unknown key train.epoch; did you mean train.epochs?"),
        ("", ["trian.epochs=3"], "unknown key trian; did you mean train?"),
        ("train: {epochs: three}\n", [], "train.epochs must be a whole number; got 'three'"),
        ("train: {epochs: 0}\n", [], "train.epochs must be >= 1; got 0"),
        ("train: {epochs: 2.5}\n", [], "train.epochs must be a whole number"),
        ("train: {learning_rate: 0}\n", [], "train.learning_rate must be > 0"),
        ("model: {dropout: 1.0}\n", [], "model.dropout must be < 1"),
        ("train: {optimizer: adamw}\n", [], "train.optimizer must be one of adam, sgd, rmsprop; got 'adamw'"),
        ("distributed: {strategies: [mirrored, bogus]}\n", [], "distributed.strategies[1] must be one of"),
        ("distributed: {strategies: mirrored}\n", [], "distributed.strategies must be a list"),
        ("mlflow: {log_models: maybe}\n", [], "mlflow.log_models must be true or false"),
        ("train: 3\n", [], "train must be a section of keys"),
        ("train: [\n", [], "is not valid YAML at line"),
        ("- a\n- b\n", [], "must hold a mapping of keys"),
        ("", ["train.epochs"], "--set 'train.epochs' must look like dotted.key=value"),
        ("", ["seed.x=1"], "seed must be a whole number"),
        ("seed: 3\n", ["seed.x=1"], "seed is not a section"),
    ],
)
def test_bad_input_names_the_key(tmp_path, text, overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text), overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="params file .*nope.yaml not found"):
        load_config(tmp_path / "nope.yaml")


def test_parse_override_keeps_strings():
    assert parse_override("data.source=/tmp/mnist.npz") == ("data.source", "/tmp/mnist.npz")


def test_flat_dict_names_every_knob():
    flat = to_flat_dict(Config())
    assert flat["train.epochs"] == 10 and flat["mlflow.experiment"] == "tfdist-mnist"


def test_pipeline_strategies_are_known_to_the_factory():
    assert set(DISTRIBUTED_STRATEGIES) <= set(STRATEGY_NAMES)
