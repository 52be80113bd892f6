"""A new sqlite tracking store, copied from MLflow's schema migrated once per MLflow version.

MLflow creates a store by running every one of its schema migrations
(alembic, about 60 revisions), seconds of CPU that the first train stage of a
fresh workspace paid before ``fit``, and every test with a store of its own
(docs/performance.md, "Start-up"). The migrated, empty schema is kept once per MLflow version in the user's
cache (:func:`cache_folder`), and a new store
is a copy of it: MLflow then finds its tables at their newest revision and
adds only its default experiment, in the store's own artifact root, as it
would have. Where the cache cannot be written, MLflow creates the store itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
from pathlib import Path

import mlflow

from tfdist.files.atomic import atomic_path
from tfdist.files.locks import exclusive_lock
from tfdist.tracking.mlflow_private import initialize_tables

log = logging.getLogger(__name__)


#: Names the folder tfdist keeps its cache in (default: ``$XDG_CACHE_HOME/tfdist``, else ``~/.cache/tfdist``).
CACHE_ENV = "TFDIST_CACHE"


def cache_folder() -> Path:
    """Where the schema is kept: ``$TFDIST_CACHE``, else ``$XDG_CACHE_HOME/tfdist``, else ``~/.cache/tfdist``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfdist"


def create_from_schema(database: Path) -> bool:
    """Create the sqlite store ``database`` (absent) as a copy of the migrated schema; False where it did not.

    Called under the lock of the store's creation (:func:`tfdist.tracking.experiment.configure`).
    The copy lands under its final name only once it is whole.
    """
    try:
        with atomic_path(database) as staged:
            shutil.copyfile(_schema(), staged)
    except Exception as err:  # the copy only saves time: whatever stops it (an unwritable cache, an MLflow
        # that moved its creation), MLflow creates the store itself, as it always did
        log.info("MLflow creates %s itself, without the schema's copy (%s)", database, err)
        return False
    return True


def discard_schema() -> None:
    """Forget the cached schema: MLflow found a store copied from it at another revision than its own."""
    schema = _schema_file()
    log.warning("the schema cache %s is not MLflow %s's; it is made again", schema, mlflow.__version__)
    schema.unlink(missing_ok=True)


def _schema_file() -> Path:
    return cache_folder() / f"mlflow-{mlflow.__version__}-schema.db"


def _schema() -> Path:
    """The empty store at MLflow's newest schema revision, migrated on first use for this MLflow version.

    A cache that is not a store (truncated, garbage: another program's, a
    full disk's) is made again; it is only a cache.
    """
    schema = _schema_file()
    if schema.is_file() and _revision(schema) is not None:
        return schema
    schema.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(schema.parent / f"{schema.name}.lock", _CACHE_LOCK_SECONDS):
        if schema.is_file() and _revision(schema) is None:
            log.warning("the schema cache %s is damaged; it is made again", schema)
            schema.unlink()
        if not schema.is_file():
            import sqlalchemy
            with atomic_path(schema) as staged:
                engine = sqlalchemy.create_engine(f"sqlite:///{staged}")
                try:
                    initialize_tables(engine)  # MLflow's own creation, without its default rows
                finally:
                    engine.dispose()
    return schema


#: Seconds to wait for another process making the cache (one migration takes seconds); then MLflow makes the store.
_CACHE_LOCK_SECONDS = 60.0


def _revision(schema: Path) -> str | None:
    """The schema revision ``schema`` holds, or None when it is no store."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{schema}?mode=ro", uri=True)) as connection:
            return connection.execute("SELECT version_num FROM alembic_version").fetchone()[0]
    except (sqlite3.Error, TypeError):
        return None
