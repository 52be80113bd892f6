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

import fcntl
import logging
import os
import shutil
from pathlib import Path

import mlflow

from tfdist.atomic import atomic_path
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


def _schema() -> Path:
    """The empty store at MLflow's newest schema revision, migrated on first use for this MLflow version."""
    folder = cache_folder()
    schema = folder / f"mlflow-{mlflow.__version__}-schema.db"
    if schema.is_file():
        return schema
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{schema.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
        if not schema.is_file():
            import sqlalchemy
            with atomic_path(schema) as staged:
                engine = sqlalchemy.create_engine(f"sqlite:///{staged}")
                try:
                    initialize_tables(engine)  # MLflow's own creation, without its default rows
                finally:
                    engine.dispose()
    return schema
