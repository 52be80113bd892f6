"""A new sqlite store is a copy of MLflow's migrated schema: the store MLflow creates (MLflow's own where no cache)."""

import sqlite3

import mlflow
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

from tfdist.config.knobs import MlflowConfig
from tfdist.tracking import experiment
from tfdist.tracking.schema import CACHE_ENV, create_from_schema


def layout(database):
    """The store's tables, indexes and their SQL's clauses, and how many rows each table holds.

    Clauses in any order: alembic rebuilds a sqlite table from a set of its
    constraints, so two stores MLflow creates list a table's CHECKs in either
    order (the ``runs`` table, one process in four).
    """
    with sqlite3.connect(database) as connection:
        schema = sorted((kind, name, sorted(line.strip().rstrip(",").strip() for line in (sql or "").splitlines()))
                        for kind, name, sql in connection.execute("SELECT type, name, sql FROM sqlite_master"))
        rows = {name: connection.execute(f'SELECT COUNT(*) FROM "{name}"').fetchone()[0]
                for kind, name, _ in schema if kind == "table"}
    return schema, rows


def test_a_store_from_the_schema_is_the_store_mlflow_creates(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    copied, made = tmp_path / "copied" / "mlflow.db", tmp_path / "made" / "mlflow.db"
    copied.parent.mkdir()
    assert create_from_schema(copied)
    schema = tmp_path / "cache" / f"mlflow-{mlflow.__version__}-schema.db"
    assert sorted(path.name for path in (tmp_path / "cache").iterdir()) == [schema.name, f"{schema.name}.lock"], \
        "the schema and its lock, nothing half-written"
    SqlAlchemyStore(f"sqlite:///{copied}", str(tmp_path / "copied" / "artifacts"))
    made.parent.mkdir()
    SqlAlchemyStore(f"sqlite:///{made}", str(tmp_path / "made" / "artifacts"))
    assert layout(copied) == layout(made), "same tables at the same revision, same default rows"

    store = SqlAlchemyStore(f"sqlite:///{copied}", str(tmp_path / "copied" / "artifacts"))
    assert store.get_experiment("0").artifact_location == str(tmp_path / "copied" / "artifacts" / "0")
    migrated_at = schema.stat().st_mtime_ns
    again = tmp_path / "again.db"
    assert create_from_schema(again)
    assert schema.stat().st_mtime_ns == migrated_at, "migrated once per MLflow version, then copied"


def test_configure_creates_a_new_store_from_the_schema(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    experiment.configure(MlflowConfig(tracking_uri=f"sqlite:///{tmp_path}/store/mlflow.db", experiment="t"))
    assert (tmp_path / "cache" / f"mlflow-{mlflow.__version__}-schema.db").is_file()
    assert mlflow.get_experiment_by_name("t") is not None


def test_where_the_cache_cannot_be_written_mlflow_creates_the_store_itself(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocked / "cache"))
    database = tmp_path / "store" / "mlflow.db"
    database.parent.mkdir()
    assert not create_from_schema(database)
    assert not database.exists() and not list(database.parent.iterdir()), "nothing half-written"
    experiment.configure(MlflowConfig(tracking_uri=f"sqlite:///{database}", experiment="t"))
    assert mlflow.get_experiment_by_name("t") is not None


def test_a_schema_that_cannot_take_its_name_leaves_no_partial_file_and_mlflow_creates_the_store(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    (cache / f"mlflow-{mlflow.__version__}-schema.db").mkdir(parents=True)  # the name is taken by a folder
    database = tmp_path / "store" / "mlflow.db"
    database.parent.mkdir()
    assert not create_from_schema(database)
    name = f"mlflow-{mlflow.__version__}-schema.db"
    assert sorted(path.name for path in cache.iterdir()) == [name, f"{name}.lock"], "the folder and the lock only"
    assert not list((cache / name).iterdir()) and not list(database.parent.iterdir()), "nothing half-written"
    experiment.configure(MlflowConfig(tracking_uri=f"sqlite:///{database}", experiment="t"))
    assert mlflow.get_experiment_by_name("t") is not None
