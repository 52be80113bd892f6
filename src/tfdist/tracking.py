"""Everything MLflow: store, experiment, runs, params, metrics, models, tags.

With :mod:`tfdist.tracking_outage` (what the chief does while the store does
not answer), the only modules that import mlflow: ``import mlflow`` alone
costs seconds, so stages import this module only when they log. TensorFlow
is imported only by the functions that save or load a model, so the compare
stage and a launcher closing its chief's run do not pay for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import urllib.parse
import warnings
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import mlflow
import mlflow.data
from mlflow.exceptions import MlflowException
from mlflow.models import infer_signature
from mlflow.utils.git_utils import get_git_commit

from tfdist.config import Config, MlflowConfig, identifying_params, to_flat_dict
from tfdist.errors import InputError, Interrupted
from tfdist.tracking_outage import Patience, unreachable
from tfdist.tracking_schema import create_from_schema
from tfdist.tracking_store import DATABASE_DRIVERS, probe_store, redact, store_uri
from tfdist.workspace import workspace_root

log = logging.getLogger(__name__)

# What a run is traced back to: the DVC stage that ran it and the experiment.
_DVC_ENV_TAGS = {"DVC_STAGE": "dvc.stage", "DVC_EXP_NAME": "dvc.experiment"}
_PARAM_VALUE_LIMIT = 6000
#: Groups the runs of one pipeline execution; filter in the UI with tags.`tfdist.execution` = '<id>'.
EXECUTION_TAG = "tfdist.execution"
# The UI opens an experiment of this kind on its training runs (not the GenAI overview).
_EXPERIMENT_KIND = "mlflow.experimentKind"
_EXPERIMENT_NOTE = (
    "Runs of the tfdist pipeline: one parent run per pipeline execution (named ``execution ID``, ID being the DVC "
    "experiment name or commit-paramshash), holding the comparison as artifacts, with one child run per training. "
    "``make ui`` prints the address of the newest execution's training runs; filter one execution with "
    "``tags.`tfdist.execution` = 'ID'``."
)
#: MLflow's own dataset digests are short; the full SHA-256 goes in the input's tags.
_DATASET_DIGEST_CHARS = 16


def configure(config: MlflowConfig) -> str:
    """Point MLflow at the configured store and experiment; return the experiment id.

    Checked here, before training, so that a bad store fails in seconds, not
    after the last epoch. A relative sqlite store is the workspace's, also
    when DVC runs the stage in an experiment copy. A new sqlite store is a copy
    of MLflow's migrated schema (:mod:`tfdist.tracking_schema`). The store's creation,
    schema upgrade and the experiment's creation happen under a file lock in
    the workspace: two stages starting at once on a fresh store
    (``dvc queue start -j 2``) would otherwise both migrate it and one fail.

    Raises:
        InputError: the store cannot be reached, opened or written, or its driver is not installed.
    """
    uri = store_uri(config.tracking_uri)
    shown = redact(config.tracking_uri)
    scheme = probe_store(uri)
    lock: contextlib.AbstractContextManager = contextlib.nullcontext()
    if scheme == "sqlite":
        database = Path(uri[len("sqlite:///"):])
        try:
            database.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise InputError(f"mlflow.tracking_uri {shown}: cannot create {database.parent} ({err.strerror})") from None
        lock = _file_lock(database.with_name(database.name + ".lock"), shown)
    elif scheme in DATABASE_DRIVERS:
        lock = _file_lock(_local_artifacts() / ".store.lock", shown)
    mlflow.set_tracking_uri(uri)
    with lock:
        if scheme == "sqlite" and not database.exists():
            create_from_schema(database)
        try:
            experiment = _get_or_create_experiment(config.experiment, scheme)
        except MlflowException as err:
            raise InputError(f"mlflow.tracking_uri {shown}: cannot use the tracking store ({err.message})") from None
    return experiment.experiment_id


def _local_artifacts() -> Path:
    """Where a store without an artifact server keeps artifacts: the workspace's ``mlruns/``."""
    folder = workspace_root() / "mlruns"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


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
def _file_lock(path: Path, shown: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` for the block (released if the process dies)."""
    try:
        handle = open(path, "a")
    except OSError as err:
        raise InputError(f"mlflow.tracking_uri {shown}: cannot write in {path.parent} ({err.strerror})") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``: MLflow params are flat strings."""
    flat: dict[str, str] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)[:_PARAM_VALUE_LIMIT]
    return flat


def context_tags() -> dict[str, str]:
    """Tags that trace a run to its code (git commit) and, when DVC ran it, its stage and experiment."""
    tags = {tag: os.environ[var] for var, tag in _DVC_ENV_TAGS.items() if os.environ.get(var)}
    commit = get_git_commit(os.getcwd())
    if commit:
        tags["git.commit"] = commit
    return tags


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
    commit = get_git_commit(os.getcwd())
    return f"{commit[:8] if commit else 'uncommitted'}-{hashlib.sha256(params.encode()).hexdigest()[:8]}"


def log_dataset(features: Any, targets: Any, name: str, sha256: str, source: str, context: str) -> None:
    """Log data as a dataset input of the active run, under the digest its report gives."""
    with warnings.catch_warnings():  # MLflow registers the local source class twice, then warns that it is ambiguous
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted in multiple ways")
        dataset = mlflow.data.from_numpy(
            features, targets=targets, source=source, name=name, digest=sha256[:_DATASET_DIGEST_CHARS]
        )
    mlflow.log_input(dataset, context=context, tags={"sha256": sha256})


#: Tags the parent run of a pipeline execution by; its stage runs are its children.
ROLE_TAG = "tfdist.role"
_EXECUTION_ROLE = "execution"
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
        **tags, EXECUTION_TAG: execution, ROLE_TAG: _EXECUTION_ROLE,
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
        filter_string=f"tags.`{EXECUTION_TAG}` = '{execution}' and tags.`{ROLE_TAG}` = '{_EXECUTION_ROLE}'",
        order_by=["attributes.start_time ASC", "attributes.run_id ASC"], output_format="list",
    )


def latest_runs_page(config: MlflowConfig) -> str:
    """The UI address (after the server's URL) of the newest execution's training runs in ``config``'s store.

    The experiment's runs page when it has no execution yet; ``""`` when the
    store has no such experiment. Reads only: nothing is created.

    Raises:
        InputError: the store cannot be read.
    """
    mlflow.set_tracking_uri(store_uri(config.tracking_uri))
    try:
        experiment = mlflow.MlflowClient().get_experiment_by_name(config.experiment)
        if experiment is None:
            return ""
        runs = mlflow.search_runs(experiment_ids=[experiment.experiment_id], max_results=1, output_format="list",
                                  filter_string=f"tags.`{ROLE_TAG}` = '{_EXECUTION_ROLE}'",
                                  order_by=["attributes.start_time DESC"])
    except MlflowException as err:
        raise InputError(f"mlflow.tracking_uri {redact(config.tracking_uri)}: cannot read the store ({err.message})") from None
    if not runs:
        return f"#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning"
    return runs_page(experiment.experiment_id, runs[0].data.tags[EXECUTION_TAG])


def runs_page(experiment_id: str, execution: str) -> str:
    """The UI's address (after the server's URL) of one execution's training runs, charted.

    ``workflowType=machine_learning`` opens MLflow 3's runs page instead of
    its GenAI overview; the filter keeps the execution's training runs (their
    parent holds the comparison as artifacts), fastest first.
    """
    query = urllib.parse.urlencode({
        "workflowType": "machine_learning",
        "compareRunsMode": "CHART",
        "searchFilter": f"tags.`{EXECUTION_TAG}` = '{execution}' and tags.stage = 'train'",
        "orderByKey": "metrics.`samples_per_second`",
        "orderByAsc": "false",
    }, quote_via=urllib.parse.quote)
    return f"#/experiments/{experiment_id}/runs?{query}"


@contextlib.contextmanager
def start_run(
    name: str, params: Mapping[str, Any], tags: Mapping[str, str], resume_run_id: str | None = None,
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
    except Interrupted:
        _end_run(run_id, "KILLED", None)
        raise
    except BaseException:
        _end_run(run_id, "FAILED", None)
        raise
    _end_run(run_id, "FINISHED", patience)


def _end_run(run_id: str, status: str, patience: Patience | None) -> None:
    """End the active run ``run_id`` with ``status``; a store that does not answer gets ``patience``, or one attempt."""
    from mlflow.tracking import fluent

    try:
        mlflow.end_run(status)  # pops the active run, stops its system metrics, then tells the store
        return
    except Exception as err:
        if not unreachable(err):
            raise
        monitor = fluent.run_id_to_system_metrics_monitor.pop(run_id, None)
        if monitor is not None:
            monitor.finish()
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


def close_if_running(run_id: str, status: str, overriding: Collection[str] = ()) -> bool:
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


def log_metrics(metrics: Mapping[str, float], run_id: str | None = None, patience: Patience | None = None) -> None:
    """Log final (step-less) metrics to the active run (waiting within ``patience``), or reopen ``run_id``."""
    values = {key: float(value) for key, value in metrics.items()}
    if run_id is None:
        if patience is None:
            mlflow.log_metrics(values)
        else:
            patience.call(lambda: mlflow.log_metrics(values), "the summary metrics")
        return
    with reopen(run_id):
        mlflow.log_metrics(values)


@contextlib.contextmanager
def reopen(run_id: str) -> Iterator[None]:
    """Make the ended run ``run_id`` active again to add to it; it ends as :func:`start_run`'s do."""
    try:
        run = mlflow.start_run(run_id=run_id)
    except MlflowException as err:
        raise InputError(f"MLflow run {run_id} cannot be reopened ({err.message}); rerun the stage that made it") from None
    with run:
        yield


def _pip_requirements() -> list[str]:
    # Given explicitly: MLflow's own inference imports the model and takes seconds.
    from tfdist.tf_imports import keras, tf

    return [f"tensorflow=={tf.__version__}", f"tf-keras=={keras.__version__}", f"mlflow=={mlflow.__version__}"]


def _model_kwargs(model: Any, example: Any) -> dict[str, Any]:
    return {
        "signature": infer_signature(example, model.predict(example, verbose=0)),
        "input_example": example,
        "pip_requirements": _pip_requirements(),
    }


def save_model(
    model: Any, path: Path, example: Any, log_to_run: bool, register_as: str | None = None,
    version_tags: Mapping[str, str] | None = None, patience: Patience | None = None,
) -> str | None:
    """Save ``model`` as an MLflow model folder (loadable by evaluate and pyfunc).

    With ``log_to_run`` it is also logged to the active run as ``model``; the
    signature (one prediction) is computed once for both. With ``register_as``
    the logged model becomes a new version of that registered model, tagged
    with ``version_tags``; the version is returned. With ``patience``, logging
    waits for a store (or its artifact store) that stopped answering.
    """
    import mlflow.tensorflow  # imports TensorFlow: only where a model is saved

    patience = patience or Patience(0.0, "")
    # MLflow validates the input example with a Keras predict that draws a progress bar on stdout.
    with contextlib.redirect_stdout(io.StringIO()):
        kwargs = _model_kwargs(model, example)
        mlflow.tensorflow.save_model(model, str(path), **kwargs)
        if not log_to_run:
            return None
        info = patience.call(lambda: mlflow.tensorflow.log_model(
            model, name="model", registered_model_name=register_as, **kwargs), "the model")
    version = info.registered_model_version
    if register_as and version is not None:
        client = mlflow.MlflowClient()
        for key, value in (version_tags or {}).items():
            patience.call(lambda key=key, value=value: client.set_model_version_tag(
                register_as, str(version), key, str(value)), "the model version's tags")
        log.info("registered the model as %s version %s", register_as, version)
    return None if version is None else str(version)


#: The alias the compare stage moves to the best registered version: models:/<name>@champion loads it.
CHAMPION_ALIAS = "champion"


def set_champion(registered_model: str, run_ids: list[str]) -> str | None:
    """Point ``registered_model@champion`` at the version logged by the first of ``run_ids`` that has one.

    ``run_ids`` come best first. Returns the version, or None when none of
    the runs registered a model (``mlflow.register_models`` was off).
    """
    client = mlflow.MlflowClient()
    for run_id in run_ids:
        versions = client.search_model_versions(f"name = '{registered_model}' and run_id = '{run_id}'")
        if versions:
            version = max(versions, key=lambda v: int(v.version)).version
            client.set_registered_model_alias(registered_model, CHAMPION_ALIAS, version)
            log.info("models:/%s@%s is version %s", registered_model, CHAMPION_ALIAS, version)
            return str(version)
    return None


def check_model(path: Path) -> None:
    """Refuse a folder that holds no model :func:`save_model` saved.

    Raises:
        InputError: the folder is missing or is not an MLflow model.
    """
    if not (Path(path) / "MLmodel").is_file():
        raise InputError(f"{path} is not a saved model (no MLmodel file); run the train stage first")


def load_model(path: Path) -> Any:
    """Load a Keras model saved by :func:`save_model`.

    Raises:
        InputError: the folder is missing or is not an MLflow model.
    """
    check_model(path)
    import mlflow.tensorflow  # imports TensorFlow: only where a model is loaded

    return mlflow.tensorflow.load_model(str(path))


def log_artifacts(paths: list[Path], artifact_path: str | None = None) -> None:
    """Attach files to the active run."""
    for path in paths:
        mlflow.log_artifact(str(path), artifact_path=artifact_path)
