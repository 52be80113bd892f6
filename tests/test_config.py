"""params.yaml as typed, strict config: every knob, its role, what it decides, and each mistake named."""

from pathlib import Path

import pytest
import yaml

from tfdist.config.knobs import ROLES, Config, ConfigError
from tfdist.config.params import check_run_name, knob_roles, load_config, parse_override, to_flat_dict
from tfdist.resume.backup import run_key

from helpers.project import REPO, tiny_params


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_params_yaml_and_the_dataclass_defaults_are_the_same_knobs_with_the_same_values():
    # Each knob is named once: params.yaml writes every knob out, with the value the code defaults to.
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    written = to_flat_dict(load_config(REPO / "params.yaml"))
    flat_raw = {}

    def walk(node, prefix=""):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                flat_raw[f"{prefix}{key}"] = value

    walk(raw)
    defaults = to_flat_dict(Config())
    assert sorted(flat_raw) == sorted(defaults), "params.yaml must list every knob, and only knobs"
    assert written == defaults, {k: (written[k], defaults[k]) for k in defaults if written[k] != defaults[k]}


def test_every_knob_has_a_role_and_the_backup_key_ignores_the_operational_ones(tmp_path):
    roles = knob_roles()
    assert set(roles) == set(to_flat_dict(Config())) and set(roles.values()) <= set(ROLES)
    assert roles["train.epochs"] == roles["runtime.intra_op_threads"] == "result"
    assert roles["mlflow.tracking_uri"] == "tracking" and roles["distributed.max_restarts"] == "operational"
    data = tmp_path / "train.npz"
    data.write_bytes(b"digits")
    key = run_key(load_config(write(tmp_path, "")), "mirrored", [data])
    for knob, value, same in (("distributed.max_restarts", 5, True), ("mlflow.log_models", False, True),
                              ("train.epochs", 3, False), ("mlflow.experiment", "other", False)):
        section, leaf = knob.split(".")
        changed = load_config(write(tmp_path, yaml.safe_dump({section: {leaf: value}})))
        assert (run_key(changed, "mirrored", [data]) == key) is same, knob


def test_make_experiments_hides_exactly_the_knobs_that_decide_no_result():
    from tfdist_cli.experiments import hidden_columns

    hidden = hidden_columns()
    for knob, role in knob_roles().items():
        assert any(__import__("re").fullmatch(pattern, knob) for pattern in hidden.split("|")) is (role != "result"), knob


@pytest.mark.parametrize("name", ["normal", "mirrored-bs256", "a.b_c", "x" * 100, "2"])
def test_plain_run_names_are_accepted(name):
    assert check_run_name(name) == name


@pytest.mark.parametrize("name", ["", "..", "../../x", "a/b", "/abs", ".hidden", "x" * 101, "new\nline", "sp ace", None])
def test_run_names_that_could_leave_their_folder_are_refused(name):
    with pytest.raises(ConfigError, match="is not a plain run name: use 1-100 letters") as raised:
        check_run_name(name)
    assert "\n" not in str(raised.value).replace(repr(name), "")


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
        ("distributed: {strategies: mirrored}\n", [], "distributed.strategies must be a list"),
        ("mlflow: {log_models: maybe}\n", [], "mlflow.log_models must be true or false"),
        ("train: 3\n", [], "train must be a section of keys"),
        ("train: [\n", [], "is not valid YAML at line"),
        ("- a\n- b\n", [], "must hold a mapping of keys"),
        ("", ["train.epochs"], "--set 'train.epochs' must look like dotted.key=value"),
        ("", ["seed.x=1"], "seed must be a whole number"),
        ("seed: 3\n", ["seed.x=1"], "seed is not a section"),
        ("runtime: {intra_op_threads: many}\n", [], "runtime.intra_op_threads must be a whole number or auto; got 'many'"),
        ("runtime: {intra_op_threads: 1.5}\n", [], "runtime.intra_op_threads must be a whole number or auto; got 1.5"),
        ("runtime: {intra_op_threads: -1}\n", [], "runtime.intra_op_threads must be >= 0; got -1"),
        ("runtime: {onednn: on}\n", [], "runtime.onednn must be a non-empty string; got True: YAML reads an unquoted on"),
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


def test_all_reduce_is_a_knob_with_three_values(tmp_path):
    config = load_config(tiny_params(tmp_path), ("distributed.all_reduce=ring",))
    assert config.distributed.all_reduce == "ring"
    with pytest.raises(Exception, match="distributed.all_reduce must be one of auto, ring, nccl"):
        load_config(tiny_params(tmp_path), ("distributed.all_reduce=horovod",))


def test_op_threads_are_auto_by_default_and_resolve_per_model_and_replicas(tmp_path):
    from tfdist.hardware import usable_cpus
    from tfdist.runtime.threads import intra_op_threads

    assert load_config(tiny_params(tmp_path)).runtime.intra_op_threads == "auto"
    assert load_config(tiny_params(tmp_path), ("runtime.intra_op_threads=3",)).runtime.intra_op_threads == 3
    cpus = len(usable_cpus())
    assert intra_op_threads("auto", "mlp", 1) == 1, "the mlp's ops are too small to split"
    assert intra_op_threads("auto", "cnn", 1) == cpus, "normal training gets every core the machine gives it"
    assert intra_op_threads("auto", "builder", 2) == max(1, cpus // 2), "two replicas in one process share them"
    assert intra_op_threads(3, "cnn", 2) == 3, "a number is taken as it is"
