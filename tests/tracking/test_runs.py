"""Tracking in MLflow: the store, runs with params and epoch metrics, models, the registry, and stores that are wrong."""

import subprocess
import sys

import mlflow
import pytest

from tfdist.config.knobs import MlflowConfig
from tfdist.errors import InputError
from tfdist.files.workspace import workspace_root
from tfdist.resume import rerun
from tfdist.resume.outbox import MetricsOutbox
from tfdist.tracking import experiment, models, runs
from tfdist.tracking.outage import Patience
from tfdist.tracking.store import redact, store_uri

from helpers.digits import MNIST
from helpers.project import tiny_params
from helpers.servers import free_ports


@pytest.fixture
def store(tmp_path):
    config = MlflowConfig(tracking_uri=f"sqlite:///{tmp_path}/store/mlflow.db", experiment="t")
    experiment.configure(config)
    return tmp_path / "store"


def test_configure_creates_the_sqlite_store(store):
    assert (store / "mlflow.db").is_file()


def test_run_logs_params_tags_and_epoch_metrics(store, monkeypatch):
    monkeypatch.setenv("DVC_STAGE", "train-normal")
    monkeypatch.setenv("DVC_EXP_NAME", "exp-1")
    patience = Patience(5.0, "the test store")
    with runs.start_run("normal", params={"train": {"epochs": 2}}, tags={"strategy": "default"}, patience=patience) as run_id:
        outbox = MetricsOutbox(run_id, patience)
        for epoch in range(2):
            outbox.put({"loss": 1.0 / (epoch + 1), "accuracy": 0.5}, step=epoch + 1)
        outbox.flush()
        outbox.close()
    run = mlflow.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "normal"
    assert run.data.params["train.epochs"] == "2"
    assert run.data.tags["dvc.stage"] == "train-normal" and run.data.tags["dvc.experiment"] == "exp-1"
    history = mlflow.MlflowClient().get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 0.5)]


def test_a_failing_run_is_marked_failed(store):
    with pytest.raises(ZeroDivisionError), runs.start_run("broken", params={}, tags={}) as run_id:
        _ = 1 / 0
    assert mlflow.get_run(run_id).info.status == "FAILED"


def test_metrics_can_be_added_to_a_finished_run(store):
    with runs.start_run("r", params={}, tags={}) as run_id:
        pass
    rerun.log_missing_metrics({"test_accuracy": 0.9}, run_id=run_id)
    run = mlflow.get_run(run_id)
    assert run.data.metrics["test_accuracy"] == 0.9 and run.info.status == "FINISHED"


def test_model_saved_for_evaluate_and_pyfunc(tmp_path, store):
    from tfdist.config.knobs import ModelConfig
    from tfdist.train.models import build_sequential

    model = build_sequential(ModelConfig(hidden_units=[8]), MNIST, exported=True)
    example = __import__("numpy").zeros((2, 784), dtype="float32")
    models.save_model(model, tmp_path / "m", example=example)
    loaded = models.load_model(tmp_path / "m")
    assert loaded.predict(example, verbose=0).shape == (2, 10)
    assert mlflow.pyfunc.load_model(str(tmp_path / "m")).predict(example).shape == (2, 10)


def test_unusable_store_fails_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(InputError, match="mlflow.tracking_uri sqlite:///.*: cannot create"):
        experiment.configure(MlflowConfig(tracking_uri=f"sqlite:///{blocker}/sub/mlflow.db"))


def test_registered_models_are_versions_of_one_name_tagged_with_their_strategy(tmp_path, store):
    from tfdist.config.knobs import ModelConfig
    from tfdist.train.models import build_sequential

    example = __import__("numpy").zeros((2, 784), dtype="float32")
    versions = []
    for strategy in ("default", "mirrored"):
        with runs.start_run(strategy, params={}, tags={}):
            model = build_sequential(ModelConfig(hidden_units=[8]), MNIST, exported=True)
            saved = models.save_model(model, tmp_path / strategy, example=example)
            version = models.log_model(saved, register_as="digits", patience=Patience(0.0, ""))
            assert version is not None
            models.tag_version("digits", version, {"strategy": strategy}, Patience(0.0, ""))
            versions.append(version)
    assert versions == ["1", "2"]
    client = mlflow.MlflowClient()
    assert [client.get_model_version("digits", v).tags["strategy"] for v in versions] == ["default", "mirrored"]
    assert mlflow.pyfunc.load_model("models:/digits/2").predict(example).shape == (2, 10)


def test_a_new_experiment_opens_on_its_training_runs(store):
    config = MlflowConfig(tracking_uri=f"sqlite:///{store}/mlflow.db", experiment="fresh")
    created = mlflow.get_experiment(experiment.configure(config))
    assert created.tags["mlflow.experimentKind"] == "custom_model_development"
    assert "tfdist.execution" in created.tags["mlflow.note.content"]


def test_execution_id_is_the_dvc_experiment_or_commit_and_params(monkeypatch):
    from tfdist.config.knobs import Config, TrainConfig

    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    first, again = runs.execution_id(Config()), runs.execution_id(Config())
    other = runs.execution_id(Config(train=TrainConfig(epochs=3)))
    assert first == again and first != other and first.split("-")[0] == other.split("-")[0]
    monkeypatch.setenv("DVC_EXP_NAME", "bf16-3ep")
    assert runs.execution_id(Config()) == "bf16-3ep"


# --- the workspace's store, also from DVC's experiment copies ------------------------------------------


def test_a_relative_sqlite_store_resolves_to_the_workspace_even_from_a_dvc_experiment_copy(tmp_path):
    copy = tmp_path / ".dvc" / "tmp" / "exps" / "tmpab12cd"
    copy.mkdir(parents=True)
    assert workspace_root(copy / "src") == tmp_path and workspace_root(tmp_path) == tmp_path
    assert store_uri("sqlite:///mlruns/mlflow.db", copy) == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    assert store_uri("sqlite:////abs/mlflow.db", copy) == "sqlite:////abs/mlflow.db"
    assert store_uri("http://127.0.0.1:5000", copy) == "http://127.0.0.1:5000"


def test_an_experiment_created_from_a_copy_keeps_its_artifacts_in_the_workspace(tmp_path, monkeypatch):
    copy = tmp_path / ".dvc" / "tmp" / "exps" / "tmpab12cd"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    experiment_id = experiment.configure(MlflowConfig(tracking_uri="sqlite:///mlruns/mlflow.db", experiment="copied"))
    assert (tmp_path / "mlruns" / "mlflow.db").is_file() and not (copy / "mlruns" / "mlflow.db").exists()
    location = mlflow.get_experiment(experiment_id).artifact_location
    assert location == (tmp_path / "mlruns" / "copied").as_uri()


def test_passwords_never_reach_a_message():
    assert redact("postgresql://team:s3cret@db.example:5432/mlflow") == "postgresql://team:***@db.example:5432/mlflow"
    assert redact("sqlite:///mlruns/mlflow.db") == "sqlite:///mlruns/mlflow.db"


def _train_with_store(tmp_path, uri, *prelude):
    """The train stage in a fresh interpreter against store ``uri`` (``prelude``: Python run first)."""
    tiny_params(tmp_path, mlflow={"tracking_uri": uri})
    code = "\n".join([*prelude, "import runpy, sys",
                      "sys.argv = ['stages/train.py', '--params', sys.argv[1], '--name', 'x']",
                      "runpy.run_module('stages.train', run_name='__main__')"])
    return subprocess.run([sys.executable, "-c", code, str(tmp_path / "params.yaml")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def test_postgres_without_its_driver_exits_2_naming_the_extra(tmp_path, prepared_copy):
    result = _train_with_store(tmp_path, "postgresql://team@127.0.0.1:1/mlflow",
                               "import sys; sys.modules['psycopg'] = None  # as if the extra were not installed")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: mlflow.tracking_uri postgresql://team@127.0.0.1:1/mlflow: the PostgreSQL driver (psycopg) is not "
        "installed; install the postgres extra: pip install -e '.[postgres]'")
    assert "Traceback" not in result.stderr and not (tmp_path / "models").exists()


def test_a_database_nobody_serves_fails_in_seconds_naming_it(tmp_path, prepared_copy):
    (port,) = free_ports()  # nothing listens there
    result = _train_with_store(tmp_path, f"postgresql://team@127.0.0.1:{port}/mlflow")
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: mlflow.tracking_uri postgresql://team@127.0.0.1:{port}/mlflow: cannot connect "
                           "to the database (")


def test_a_launcher_closes_a_run_its_stopped_chief_left_running_and_corrects_a_killed_one(store):
    with runs.start_run("finished", params={}, tags={}) as finished:
        pass
    killed = mlflow.start_run(run_name="stopped").info.run_id
    mlflow.end_run("KILLED")  # the chief saw only its launcher's SIGTERM
    running = mlflow.start_run(run_name="left running").info.run_id
    mlflow.end_run("RUNNING")  # as a SIGKILL leaves it

    assert runs.close_if_running(running, "FAILED")
    assert not runs.close_if_running(killed, "FAILED"), "a KILLED run stays KILLED unless told otherwise"
    assert runs.close_if_running(killed, "FAILED", overriding=("KILLED",))
    assert not runs.close_if_running(finished, "FAILED", overriding=("KILLED",))
    statuses = {run_id: mlflow.get_run(run_id).info.status for run_id in (finished, killed, running)}
    assert statuses == {finished: "FINISHED", killed: "FAILED", running: "FAILED"}
