"""The private MLflow APIs tfdist relies on (all in tfdist.tracking.mlflow_private) still do what it needs.

If an MLflow upgrade moves or changes one, this fails first, naming it.
"""

import threading

import mlflow
import pytest
import sqlalchemy
from mlflow.exceptions import MlflowException
from mlflow.tracking import fluent
from mlflow.utils.rest_utils import http_request

from tfdist.tracking import mlflow_private

from helpers.servers import free_ports


def test_the_system_metrics_monitor_of_a_run_is_found_and_stopped(tmp_path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    mlflow.set_experiment("system metrics")  # in this store: an earlier test's active experiment is not here
    mlflow.set_system_metrics_sampling_interval(1)
    before = set(threading.enumerate())
    run = mlflow.start_run(log_system_metrics=True)
    try:
        assert run.info.run_id in fluent.run_id_to_system_metrics_monitor
        started = [thread for thread in set(threading.enumerate()) - before if thread.name == "SystemMetricsMonitor"]
        assert started, "MLflow samples in a thread of its own"
        mlflow_private.finish_system_metrics(run.info.run_id)
        assert run.info.run_id not in fluent.run_id_to_system_metrics_monitor
        assert not any(thread.is_alive() for thread in started), "its thread joined"
    finally:
        mlflow.end_run()
        mlflow.set_system_metrics_sampling_interval(None)


def test_a_request_nobody_answers_is_told_from_a_refusal_by_its_message():
    (port,) = free_ports(1)
    creds = mlflow.utils.credentials.get_default_host_creds(f"http://127.0.0.1:{port}")
    with pytest.raises(MlflowException) as raised:
        http_request(creds, "/api/2.0/mlflow/experiments/get", "GET", max_retries=0, timeout=2)
    assert mlflow_private.request_failed(str(raised.value.message)), raised.value.message
    assert not mlflow_private.request_failed("RESOURCE_DOES_NOT_EXIST: Run 'x' not found")


def test_the_tables_are_created_at_the_newest_revision(tmp_path):
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path}/schema.db")
    try:
        mlflow_private.initialize_tables(engine)
        with engine.connect() as connection:
            tables = set(sqlalchemy.inspect(connection).get_table_names())
            revision = connection.execute(sqlalchemy.text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()
    assert {"experiments", "runs", "metrics", "params", "registered_models", "alembic_version"} <= tables
    assert revision, "stamped with MLflow's newest revision"


def test_the_server_names_the_sgi_it_runs_under(monkeypatch):
    monkeypatch.setenv("_MLFLOW_SGI_NAME", "uvicorn")
    assert mlflow_private.served_by_uvicorn()
    monkeypatch.setenv("_MLFLOW_SGI_NAME", "gunicorn")
    assert not mlflow_private.served_by_uvicorn()


def test_schema_revisions_start_at_the_revision_mlflow_creates_a_store_at(tmp_path):
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path}/new.db")
    try:
        mlflow_private.initialize_tables(engine)
        with engine.connect() as connection:
            created = connection.execute(sqlalchemy.text("SELECT version_num FROM alembic_version")).scalar_one()
    finally:
        engine.dispose()
    revisions = mlflow_private.schema_revisions()
    assert revisions[0] == created and len(revisions) == len(set(revisions)) > 10


def test_forget_engine_makes_mlflow_read_a_replaced_store_file_anew(tmp_path):
    import shutil

    uri, other = f"sqlite:///{tmp_path}/mlflow.db", f"sqlite:///{tmp_path}/other.db"
    mlflow.MlflowClient(uri).create_experiment("before")
    mlflow.MlflowClient(other).create_experiment("after")
    mlflow_private.forget_engine(other)
    shutil.copyfile(tmp_path / "other.db", tmp_path / "mlflow.db.new")
    (tmp_path / "mlflow.db.new").replace(tmp_path / "mlflow.db")  # another store put where the first was
    mlflow_private.forget_engine(uri)
    names = {e.name for e in mlflow.MlflowClient(uri).search_experiments()}
    assert "after" in names and "before" not in names, "a new engine reads the new file, not the old one's connections"


def test_the_switch_that_keeps_mlflow_s_job_runners_off_is_still_mlflow_s():
    """tfdist's servers start without MLflow's GenAI job consumers (tfdist_cli.serving): the variable must exist."""
    from mlflow.environment_variables import MLFLOW_SERVER_ENABLE_JOB_EXECUTION

    from tfdist_cli.serving import JOB_EXECUTION_ENV

    assert MLFLOW_SERVER_ENABLE_JOB_EXECUTION.name == JOB_EXECUTION_ENV
    assert MLFLOW_SERVER_ENABLE_JOB_EXECUTION.default is True, "on unless turned off: tfdist turns it off"
