"""A pipeline execution's parent run and each stage's run: params, tags, metrics, datasets, artifacts.

A stage opens its run with :func:`start_run`, nested under its execution's
parent (:func:`execution_run`); the run ends FINISHED, FAILED or KILLED as
the stage does. TensorFlow is never imported here (models are
:mod:`tfdist.tracking.models`'), so the compare stage and a launcher closing
its chief's run do not pay for it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import subprocess
import warnings
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import mlflow
import mlflow.data
import numpy as np
from mlflow.exceptions import MlflowException

from tfdist.config.knobs import Config
from tfdist.config.params import dotted_keys, identifying_params, to_flat_dict
from tfdist.errors import InputError, Interrupted, Preempted
from tfdist.tracking.mlflow_private import finish_system_metrics
from tfdist.tracking.outage import Patience, unreachable

log = logging.getLogger(__name__)

# What a run is traced back to: the DVC stage that ran it and the experiment.
_DVC_ENV_TAGS = {"DVC_STAGE": "dvc.stage", "DVC_EXP_NAME": "dvc.experiment"}
_PARAM_VALUE_LIMIT = 6000
#: Groups the runs of one pipeline execution; filter in the UI with tags.`tfdist.execution` = '<id>'.
EXECUTION_TAG = "tfdist.execution"
#: A run stopped by a SIGTERM it backed up for: where (KILLED then, FINISHED once a rerun goes on and ends).
PREEMPTED_TAG = "tfdist.preempted"
#: MLflow's own dataset digests are short; the full SHA-256 goes in the input's tags.
_DATASET_DIGEST_CHARS = 16
#: Seconds ``git rev-parse`` gets to name the commit before the run goes without it.
_GIT_TIMEOUT = 10.0


def flatten(mapping: Mapping[str, Any]) -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``: MLflow params are flat strings."""
    return {key: str(value)[:_PARAM_VALUE_LIMIT] for key, value in dotted_keys(mapping).items()}


def context_tags() -> dict[str, str]:
    """Tags that trace a run to its code (git commit) and, when DVC ran it, its stage and experiment."""
    tags = {tag: os.environ[var] for var, tag in _DVC_ENV_TAGS.items() if os.environ.get(var)}
    commit = git_commit()
    if commit:
        tags["git.commit"] = commit
    return tags


@functools.cache
def git_commit() -> str | None:
    """The commit checked out in the working folder (``git rev-parse HEAD``); None outside a repository or without git."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=_GIT_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def execution_id(config: Config) -> str:
    """Names one pipeline execution, the same in every stage of it without shared state.

    ``dvc exp run`` names its experiment in ``DVC_EXP_NAME``; otherwise the git
    commit and a hash of the identifying params (all but operational knobs)
    identify what ran (a rerun of the same commit and params is the same
    execution, as far as the results go).
    """
    experiment = os.environ.get("DVC_EXP_NAME")
    if experiment:
        return experiment
    params = json.dumps(identifying_params(config), sort_keys=True, default=str)
    commit = git_commit()
    return f"{commit[:8] if commit else 'uncommitted'}-{hashlib.sha256(params.encode()).hexdigest()[:8]}"


def log_dataset(*, name: str, sha256: str, source: str, context: str, features: int, records: int) -> None:
    """Log prepared data as a dataset input of the active run, under the digest its report gives: its name, source
    folder and schema (``features`` uint8 pixels a row, an int64 label), and ``records`` in a tag, never its rows."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.types import Schema, TensorSpec

    schema = Schema([TensorSpec(np.dtype(np.uint8), (-1, features), "image"), TensorSpec(np.dtype(np.int64), (-1,), "label")])
    with warnings.catch_warnings():  # MLflow registers the local source class twice, then warns that it is ambiguous
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted in multiple ways")
        where = resolve_dataset_source(source)
    dataset = MetaDataset(where, name=name, digest=sha256[:_DATASET_DIGEST_CHARS], schema=schema)
    mlflow.log_input(dataset, context=context, tags={"sha256": sha256, "records": str(records)})


#: Tags the parent run of a pipeline execution by; its stage runs are its children.
ROLE_TAG = "tfdist.role"
EXECUTION_ROLE = "execution"
#: Seconds between system metric samples (CPU, memory): MLflow's default of 10 s misses runs of seconds.
SYSTEM_METRICS_INTERVAL = 1.0


def execution_run(config: Config) -> str:
    """The parent run of this pipeline execution: found by its tags, or created; its id.

    Every stage of an execution nests its run under it, so MLflow's run list
    reads as executions. It is a record, not a process: created FINISHED, it
    is never left RUNNING by a stage that dies; the compare stage reopens it
    to attach the comparison. Should two stages of one execution create it at
    once, both settle on the oldest and the other is deleted.
    """
    execution = execution_id(config)
    found = _execution_runs(execution)
    if found:
        return found[0].info.run_id
    tags = {key: value for key, value in context_tags().items() if key != "dvc.stage"}  # of every stage, not the first
    with mlflow.start_run(run_name=f"execution {execution}", tags={
        **tags, EXECUTION_TAG: execution, ROLE_TAG: EXECUTION_ROLE,
        "mlflow.note.content": f"One execution of the tfdist pipeline ({execution}): its stage runs are nested here; "
                               "the comparison of them is this run's artifacts.",
    }) as run:
        created = run.info.run_id
        mlflow.log_params(flatten(to_flat_dict(config)))
    oldest = _execution_runs(execution)[0].info.run_id
    if oldest != created:
        mlflow.MlflowClient().delete_run(created)
    return oldest


def _execution_runs(execution: str) -> list[Any]:
    """Parent runs tagged with ``execution``, oldest first."""
    return mlflow.search_runs(
        filter_string=f"tags.`{EXECUTION_TAG}` = '{execution}' and tags.`{ROLE_TAG}` = '{EXECUTION_ROLE}'",
        order_by=["attributes.start_time ASC", "attributes.run_id ASC"], output_format="list",
    )


@contextlib.contextmanager
def start_run(
    name: str, *, params: Mapping[str, Any], tags: Mapping[str, str], resume_run_id: str | None = None,
    parent_run_id: str | None = None, system_metrics: bool = False, patience: Patience | None = None,
) -> Iterator[str]:
    """Open a run, log ``params`` and ``tags``, yield its id.

    With ``resume_run_id`` (a run this store holds), that run is reopened
    instead: a training resumed after a crash continues its own run, metrics
    at the following steps. With ``parent_run_id`` the run is nested under
    that one. With ``system_metrics`` MLflow samples CPU and memory use every
    :data:`SYSTEM_METRICS_INTERVAL` seconds while the run is open. The run
    ends FINISHED on success (waiting within ``patience`` for a store that
    stopped answering), FAILED on an exception and KILLED on Ctrl-C or
    SIGTERM (one attempt each: a store that does not answer leaves it
    RUNNING, for a rerun to reopen), never left RUNNING by a store that answers.
    """
    if system_metrics:
        mlflow.set_system_metrics_sampling_interval(SYSTEM_METRICS_INTERVAL)
        mlflow.set_system_metrics_samples_before_logging(1)
    if resume_run_id and _exists(resume_run_id):
        run = mlflow.start_run(run_id=resume_run_id, log_system_metrics=system_metrics)
        mlflow.set_tags({**context_tags(), **tags})
    else:
        run = mlflow.start_run(run_name=name, tags={**context_tags(), **tags}, parent_run_id=parent_run_id,
                               log_system_metrics=system_metrics)
        mlflow.log_params(flatten(params))
    run_id = run.info.run_id
    try:
        yield run_id
    except Interrupted as stop:
        if isinstance(stop, Preempted):  # KILLED, as every stop before the end; the tag says it backed up first
            _tag_quietly(run_id, PREEMPTED_TAG, stop.where)
        _end_run(run_id, "KILLED", None)
        raise
    except BaseException:
        _end_run(run_id, "FAILED", None)
        raise
    _end_run(run_id, "FINISHED", patience)


def _tag_quietly(run_id: str, key: str, value: str) -> None:
    """Tag the active run; a store that does not answer only costs the tag (the run still ends)."""
    try:
        mlflow.set_tag(key, value)
    except Exception as err:  # noqa: BLE001 - the stop goes on whatever the store says
        log.warning("MLflow run %s: could not tag %s (%s)", run_id, key, str(err).splitlines()[0] if str(err) else err)


def _end_run(run_id: str, status: str, patience: Patience | None) -> None:
    """End the active run ``run_id`` with ``status``; a store that does not answer gets ``patience``, or one attempt."""
    try:
        mlflow.end_run(status)  # pops the active run, stops its system metrics, then tells the store
        return
    except Exception as err:
        if not unreachable(err):
            raise
        finish_system_metrics(run_id)
    if patience is None:
        log.warning("MLflow run %s stays RUNNING: the store did not answer when it ended %s", run_id, status)
        return
    patience.call(lambda: mlflow.MlflowClient().set_terminated(run_id, status=status), f"the run's end ({status})")


def _exists(run_id: str) -> bool:
    try:
        mlflow.MlflowClient().get_run(run_id)
    except MlflowException:
        log.warning("MLflow run %s from the backup is not in this store; starting a new run", run_id)
        return False
    return True


def set_tags(tags: Mapping[str, Any]) -> None:
    """Tag the active run (values as strings)."""
    mlflow.set_tags({key: str(value) for key, value in tags.items()})


def close_if_running(run_id: str, status: str, *, overriding: Collection[str] = ()) -> bool:
    """End run ``run_id`` with ``status`` (FAILED, KILLED) if it is still RUNNING, or ended with a status in ``overriding``.

    For a run whose process could not end it, or ended it without knowing why
    it was stopped: a worker killed, or stopped (KILLED), by its launcher.
    Returns whether the run was closed here.
    """
    client = mlflow.MlflowClient()
    try:
        if client.get_run(run_id).info.status not in ("RUNNING", *overriding):
            return False
    except MlflowException:
        return False  # not in this store (it moved, or was deleted)
    client.set_terminated(run_id, status=status)
    return True


@contextlib.contextmanager
def reopen(run_id: str) -> Iterator[None]:
    """Make the ended run ``run_id`` active again to add to it; it ends as :func:`start_run`'s do."""
    try:
        run = mlflow.start_run(run_id=run_id)
    except MlflowException as err:
        raise InputError(f"MLflow run {run_id} cannot be reopened ({err.message}); rerun the stage that made it") from None
    with run:
        yield


def log_folder(folder: Path, artifact_path: str) -> None:
    """Attach a folder's tree to the active run, under ``artifact_path``."""
    mlflow.log_artifacts(str(folder), artifact_path=artifact_path)


def log_artifacts(paths: list[Path], artifact_path: str | None = None) -> None:
    """Attach files to the active run."""
    for path in paths:
        mlflow.log_artifact(str(path), artifact_path=artifact_path)
