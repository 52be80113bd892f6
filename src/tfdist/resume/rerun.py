"""What a rerun skips: whatever the run's backup or its MLflow run already holds.

One rule, asked at each of the chief's last steps: a stage rerun after a kill
(or after an outage that outlasted it) ends as the killed run would have. The
backup's epochs are restored, not trained again (:mod:`tfdist.resume.checkpoints`);
the report it recorded is handed on, not measured again (:func:`recorded_report`);
a model or a metric value the run holds is not logged again (:func:`logged_model`,
:func:`log_missing_metrics`); and the runs a stopped attempt left RUNNING are
closed (:func:`retire_runs`; a launcher's, whose chief was stopped:
:func:`tfdist.resume.backup.close_stopped_runs`, which imports MLflow only where a run is left).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import mlflow
from mlflow.entities import LoggedModelStatus

from tfdist.errors import InputError
from tfdist.records.reports import TrainReport, from_dict
from tfdist.resume.backup import RunBackup
from tfdist.tracking import runs
from tfdist.tracking.outage import Patience

log = logging.getLogger(__name__)


def recorded_report(backup: RunBackup, digest: str) -> TrainReport | None:
    """The report a killed run of these params built and logged before its outputs were in place, if any.

    A rerun hands it on unchanged, so that its outputs and its MLflow run
    are those the killed run would have left: not a second measurement of
    the step (and a second value of each summary metric at one step), nor
    a report saying it resumed at the last epoch. ``digest``: the weights'
    sha256, which the report must name.
    """
    recorded = backup.state.get("report")
    if not recorded:
        return None
    try:
        report = from_dict(TrainReport, recorded, f"{backup.state_file} (report)")
    except InputError as err:
        log.warning("not reusing the report in the backup: %s", err)
        return None
    return report if report.weights_sha256 == digest else None


def logged_model(register_as: str | None) -> tuple[bool, str | None]:
    """Whether a killed attempt of the active run logged its model already, and that model's version.

    A model that attempt left unfinished (not READY) is deleted, to be logged
    again; one logged but not yet registered is registered now.
    """
    run = mlflow.active_run()
    assert run is not None, "a model is logged to the active run"
    client = mlflow.MlflowClient()
    found = client.search_logged_models([run.info.experiment_id],
                                        filter_string=f"source_run_id = '{run.info.run_id}' AND name = 'model'")
    ready = [logged for logged in found if logged.status == LoggedModelStatus.READY]
    for logged in found:
        if logged.status != LoggedModelStatus.READY:
            client.delete_logged_model(logged.model_id)
    if not ready:
        return False, None
    log.info("the run holds its model already (%s): not logging it again", ready[0].model_id)
    if register_as is None:
        return True, None
    versions = client.search_model_versions(f"name = '{register_as}' AND run_id = '{run.info.run_id}'")
    if versions:
        return True, str(versions[0].version)
    return True, str(mlflow.register_model(ready[0].model_uri, register_as).version)


def log_missing_metrics(metrics: Mapping[str, float], *, run_id: str | None = None,
                        patience: Patience | None = None) -> None:
    """Log final (step-less) metrics to the active run (waiting within ``patience``), or reopen ``run_id``.

    A value the run holds already is not logged again: a stage rerun after a
    kill that came once its metrics were logged leaves one value per metric, not two at one step.
    """
    values = {key: float(value) for key, value in metrics.items()}
    if run_id is None:
        if patience is None:
            _log_new(values)
        else:
            patience.call(lambda: _log_new(values), "the summary metrics")
        return
    with runs.reopen(run_id):
        _log_new(values)


def _log_new(values: Mapping[str, float]) -> None:
    """Log to the active run, at step 0, those of ``values`` it does not hold there with that value.

    One read of the run's latest values; a metric whose latest is another (one
    also logged per epoch, at later steps) has its history read.
    """
    run = mlflow.active_run()
    assert run is not None, "metrics are logged to the active run"
    client = mlflow.MlflowClient()
    latest = client.get_run(run.info.run_id).data.metrics
    new = {key: value for key, value in values.items() if latest.get(key) != value and not (
        key in latest and any(m.step == 0 and m.value == value for m in client.get_metric_history(run.info.run_id, key)))}
    if new:
        mlflow.log_metrics(new)


def retire_runs(abandoned_run_id: str | None, stale: list[RunBackup]) -> None:
    """Close the run of a backup set aside as damaged (``abandoned_run_id``) and those of ``stale`` backups
    (other params), and remove the stale backups: this run starts afresh beside them."""
    if abandoned_run_id and runs.close_if_running(abandoned_run_id, "KILLED"):
        log.info("closed MLflow run %s as KILLED: its backup was damaged, so this run starts afresh", abandoned_run_id)
    for backup in stale:
        if backup.run_id and runs.close_if_running(backup.run_id, "KILLED"):
            log.info("closed MLflow run %s as KILLED: it stopped before finishing and its params changed since",
                     backup.run_id)
        backup.remove()
