"""Every use of MLflow's private API, in one place, each with a test (tests/tracking/test_mlflow_private.py).

MLflow reworks its internals between minor versions; a rename here should
fail one test naming what moved, not every stage at import. Each function
imports what it uses when it is called.
"""

from __future__ import annotations

from typing import Any


def finish_system_metrics(run_id: str) -> None:
    """Stop the system-metrics thread MLflow started for ``run_id``, where ``end_run`` could not reach the store.

    ``mlflow.end_run`` stops the monitor only after telling the store; when the
    store does not answer, the thread would go on sampling into a dead store.
    """
    from mlflow.tracking import fluent

    monitor = fluent.run_id_to_system_metrics_monitor.pop(run_id, None)
    if monitor is not None:
        monitor.finish()


def request_failed(message: str) -> bool:
    """Whether an MlflowException's ``message`` is MLflow's REST client giving up on a request after its retries.

    MLflow raises it as a plain MlflowException (``INTERNAL_ERROR``), with only
    the text ("API request to ... failed with exception ...") to tell it from a
    refusal.
    """
    return message.startswith("API request to") and ("failed with exception" in message or "timeout" in message)


def initialize_tables(engine: Any) -> None:
    """Create MLflow's tables at its newest schema revision in ``engine``'s empty database, without default rows."""
    from mlflow.store.db.utils import _initialize_tables

    _initialize_tables(engine)


def schema_revisions() -> list[str]:
    """MLflow's schema revisions, newest first: what its ``mlflow db upgrade`` can migrate from."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    return [script.revision for script in ScriptDirectory.from_config(_get_alembic_config(db_url="")).walk_revisions()]


def forget_engine(uri: str) -> None:
    """Close the database engine MLflow keeps for ``uri``, so that the next store it opens there reads the file anew.

    MLflow keeps one engine per URI for the process's life, with its
    connections open: a store file replaced under it would not be seen.
    """
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    engine = SqlAlchemyStore._engine_map.pop(uri, None)
    if engine is not None:
        engine.dispose()


def served_by_uvicorn() -> bool:
    """Whether ``mlflow server`` runs its app under uvicorn (FastAPI in front of Flask) rather than gunicorn/waitress."""
    from mlflow.environment_variables import _MLFLOW_SGI_NAME

    return _MLFLOW_SGI_NAME.get() == "uvicorn"
