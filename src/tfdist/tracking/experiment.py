"""MLflow pointed at the configured store and experiment, created under a lock where they are new.

A relative sqlite store is the workspace's, also when DVC runs a stage in an
experiment copy; a store that cannot be opened fails here, before training,
naming its URI.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException

from tfdist.config.knobs import MlflowConfig
from tfdist.errors import InputError, RunError
from tfdist.files.disk import read_only
from tfdist.files.locks import exclusive_lock
from tfdist.files.workspace import private_folder, workspace_root
from tfdist.tracking.mlflow_private import forget_engine, schema_revisions
from tfdist.tracking.schema import create_from_schema, discard_schema
from tfdist.tracking.store import DATABASE_DRIVERS, probe_store, redact, sqlite_path, store_uri

# The UI opens an experiment of this kind on its training runs (not the GenAI overview).
_EXPERIMENT_KIND = "mlflow.experimentKind"
_EXPERIMENT_NOTE = (
    "Runs of the tfdist pipeline: one parent run per pipeline execution (named ``execution ID``, ID being the DVC "
    "experiment name or commit-paramshash), holding the comparison as artifacts, with one child run per training. "
    "``tfdist ui`` prints the address of the newest execution's training runs; filter one execution with "
    "``tags.`tfdist.execution` = 'ID'``."
)


def configure(config: MlflowConfig) -> str:
    """Point MLflow at the configured store and experiment; return the experiment id.

    Checked here, before training, so that a bad store fails in seconds, not
    after the last epoch. A relative sqlite store is the workspace's, also
    when DVC runs the stage in an experiment copy. A new sqlite store is a copy
    of MLflow's migrated schema (:mod:`tfdist.tracking.schema`). The store's creation,
    schema upgrade and the experiment's creation happen under a file lock in
    the workspace: two stages starting at once on a fresh store
    (``dvc queue start -j 2``) would otherwise both migrate it and one fail.

    Raises:
        InputError: the store cannot be reached, opened or written, or its driver is not installed.
    """
    uri = store_uri(config.tracking_uri)
    shown = redact(config.tracking_uri)
    scheme = probe_store(uri, busy_timeout=config.busy_timeout)
    lock: contextlib.AbstractContextManager = contextlib.nullcontext()
    if scheme == "sqlite":
        database = sqlite_path(uri)
        private_folder(database.parent, key=f"mlflow.tracking_uri {shown}")
        lock = _file_lock(database.parent, shown, config.busy_timeout)
    elif scheme in DATABASE_DRIVERS:
        lock = _file_lock(_local_artifacts(), shown, config.busy_timeout)
    mlflow.set_tracking_uri(uri)
    with lock:
        created = scheme == "sqlite" and not database.exists() and create_from_schema(database)
        try:
            try:
                experiment = _get_or_create_experiment(config.experiment, scheme)
            except MlflowException as err:
                if not (created and _FOUND_REVISION.search(err.message)):
                    raise
                # the new store is a copy of a cached schema at another revision: made again, from a new cache
                database.unlink()
                forget_engine(uri)
                discard_schema()
                create_from_schema(database)
                experiment = _get_or_create_experiment(config.experiment, scheme)
        except MlflowException as err:
            raise InputError(f"mlflow.tracking_uri {shown}: {_store_problem(err.message, uri)}") from None
    return experiment.experiment_id


def _store_problem(message: str, uri: str) -> str:
    """What is wrong with a store MLflow refused, and the fix: MLflow's own advice fits an older schema only."""
    found = _FOUND_REVISION.search(message)
    if found is None:
        return f"cannot use the tracking store ({message.splitlines()[0]})"
    revisions = schema_revisions()
    if found.group(1) in revisions:
        return (f"its schema is from an older MLflow (revision {found.group(1)}; MLflow {mlflow.__version__} needs "
                f"{revisions[0]}); back it up, then upgrade it in place: mlflow db upgrade {uri}")
    return (f"its schema revision {found.group(1)} is unknown to MLflow {mlflow.__version__}: a newer MLflow wrote it; "
            "upgrade MLflow (pip install -U mlflow) or point mlflow.tracking_uri at another store")


#: MLflow's words for a store at another schema revision than its own.
_FOUND_REVISION = re.compile(r"out-of-date database schema \(found version (\w+)")


def _local_artifacts() -> Path:
    """Where a store without an artifact server keeps artifacts: the workspace's ``mlruns/``."""
    return private_folder(workspace_root() / "mlruns")


def _get_or_create_experiment(name: str, scheme: str) -> Any:
    """The experiment ``name``, created (tagged for the UI) if missing.

    Created with its artifacts in the workspace's ``mlruns/`` for a store
    MLflow opens directly (MLflow's default is ``./mlruns`` of whichever
    directory created it: DVC's experiment copy, for a queued experiment);
    a server decides for itself. Creating it twice at once (two processes on
    one server) is fine: the loser reads the winner's.
    """
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        location = None
        if scheme not in ("http", "https"):
            location = (_local_artifacts() / _slug(name)).as_uri()
        try:
            client.create_experiment(name, artifact_location=location, tags={
                _EXPERIMENT_KIND: "custom_model_development", "mlflow.note.content": _EXPERIMENT_NOTE})
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        experiment = client.get_experiment_by_name(name)
    mlflow.set_experiment(experiment_id=experiment.experiment_id)
    return experiment


def _slug(name: str) -> str:
    """An experiment name as one folder name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".") or "experiment"


@contextlib.contextmanager
def _file_lock(path: Path, shown: str, timeout: float) -> Iterator[None]:
    """An exclusive lock on ``path`` for the block (released if the process dies), waited for ``timeout`` seconds at most.

    The store's folder is locked itself: a lock file would be left in the workspace. A folder that
    cannot be written is named here, before MLflow fails in it.
    """
    if not os.access(path, os.W_OK | os.X_OK):
        reason = "Read-only file system" if read_only(path) else "Permission denied"
        raise InputError(f"mlflow.tracking_uri {shown}: cannot write in {path} ({reason})")
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(exclusive_lock(path, timeout))
        except TimeoutError:
            raise RunError(f"mlflow.tracking_uri {shown}: another process has held {path} for {timeout:.0f} s "
                           "(mlflow.busy_timeout) while it creates the store; stop it and run again") from None
        except OSError as err:
            raise InputError(f"mlflow.tracking_uri {shown}: cannot write in {path} ({err.strerror})") from None
        yield
