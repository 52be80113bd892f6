"""A training run's phases, one at a time, in this process (no stage, no subprocess): the trainer's, then the recorder's."""

import os

import mlflow
import pytest

from tfdist.config.knobs import MlflowConfig
from tfdist.config.params import load_config
from tfdist.distribute.registry import get_spec
from tfdist.hardware import CpuMeter
from tfdist.records.measures import mlflow_metrics
from tfdist.records.reports import TrainReport, read_report, write_report
from tfdist.records.run_names import RunPaths
from tfdist.resume.backup import RunBackup
from tfdist.resume.outbox import MetricsOutbox, TrackedEpochs
from tfdist.tf_imports import tf
from tfdist.tracking import experiment, runs
from tfdist.tracking.outage import Patience
from tfdist.train.chief_run import ChiefRun
from tfdist.train.task_run import TaskRun

from helpers.project import tiny_params


def test_the_phases_of_a_chief_run_one_by_one(tmp_path, prepared_copy):
    config = load_config(tiny_params(tmp_path, train={"epochs": 1}, mlflow={"log_models": True}))
    paths = RunPaths(prepared_copy, tmp_path / "models" / "phases", tmp_path / "backups")
    trainer = TaskRun(config, get_spec("default"), "phases", paths)

    trainer.start()
    assert trainer.info.name == "default" and trainer.info.replicas == 1
    trainer.load()
    assert len(trainer.train_split) == 3600 and len(trainer.val_split) == 400
    assert trainer.backup.folder == tmp_path / "backups" / "phases" / trainer.key and not trainer.stale
    run = ChiefRun(trainer)
    run.open()  # the store exists now, before any training
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()

    with run.recording() as recording:
        with CpuMeter() as cpu:
            result = trainer.fit([recording.epochs])
        assert [row["epoch"] for row in result.history] == [1]
        assert (trainer.backup.folder / "state.json").is_file(), "the epoch was backed up"
        index = next(trainer.backup.folder.rglob("*.index"))
        names = [name for name, _ in tf.train.list_variables(str(index.with_suffix("")))]
        assert names and not [name for name in names if "Sequential" in name or "Classifier" in name], (
            "a backup names no model class, so renaming one keeps old backups restoring")
        saved, digest = recording.save_model(result)
        assert (saved.path / "MLmodel").is_file() and not paths.model.exists(), "staged, not yet in place"
        recording.log_model(saved)
        assert mlflow.MlflowClient().search_logged_models([mlflow.active_run().info.experiment_id])
        report = recording.summarize(result, digest, cpu).report
    assert (paths.model / "MLmodel").is_file(), "in place once the run ended"
    assert not trainer.backup.folder.exists(), "the backup goes once the outputs are in place"
    assert mlflow.get_run(report.mlflow_run_id).info.status == "FINISHED"
    assert mlflow_metrics(report).items() <= mlflow.get_run(report.mlflow_run_id).data.metrics.items()

    assert isinstance(report, TrainReport) and report.run_label == "phases · fit · float32"
    assert report.machine is not None and report.machine.usable_cpus == len(os.sched_getaffinity(0))
    assert 0 <= report.machine.steal_percent <= 100 and 0 <= report.machine.others_percent <= 100
    assert report.paradigm == "none" and report.hardware.cpu_cores == os.cpu_count()
    assert report.hardware.device_kinds in (["CPU"], ["GPU"]) and len(report.weights_sha256) == 64
    write_report(tmp_path / "phases.json", report)
    assert read_report(tmp_path / "phases.json", TrainReport) == report


STAMP = 1_700_000_000_000
PATIENCE = Patience(30.0, "the test store")


@pytest.fixture
def two_epochs_backed_up(tmp_path):
    """A store, and a backup holding epochs 1 and 2 with the timestamps their metrics were stamped with."""
    experiment.configure(MlflowConfig(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db", experiment="t"))
    backup = RunBackup(tmp_path / "backup")
    for epoch in (1, 2):
        backup.record_epoch({"epoch": epoch, "loss": 1.0 / epoch, "val_accuracy": 0.4 * epoch}, STAMP + epoch)
    return backup


def tracked_epochs(run_id: str, backup: RunBackup, epochs: int, fit) -> None:
    """Run ``fit(tracked)`` on a ``TrackedEpochs`` of ``epochs``, then wait until the store has what it sent."""
    outbox = MetricsOutbox(run_id, PATIENCE)
    tracked = TrackedEpochs(outbox, backup)
    tracked.set_params({"epochs": epochs})
    fit(tracked)
    outbox.flush()
    outbox.close()


def test_a_resumed_run_sends_its_restored_epochs_again_and_the_store_keeps_one_copy(two_epochs_backed_up):
    # The crash this covers: epoch 2 was backed up, then the stage was killed before the outbox sent it.
    backup = two_epochs_backed_up

    def resumed_fit(tracked):
        tracked.on_epoch_begin(2)  # epochs 1-2 are restored
        backup.record_epoch({"epoch": 3, "loss": 0.25, "val_accuracy": 0.9}, STAMP + 3)
        tracked.on_epoch_end(2)
        tracked.on_train_end()

    with runs.start_run("resumed", params={}, tags={}, patience=PATIENCE) as run_id:
        killed = MetricsOutbox(run_id, PATIENCE)  # what the killed stage sent: epoch 1
        killed.put({"loss": 1.0, "val_accuracy": 0.4}, step=1, timestamp=STAMP + 1)
        killed.flush()
        killed.close()
        tracked_epochs(run_id, backup, 3, resumed_fit)

    client = mlflow.MlflowClient()
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(1, 1.0), (2, 0.5), (3, 0.25)]
    assert [m.step for m in client.get_metric_history(run_id, "val_accuracy")] == [1, 2, 3]


def test_a_rerun_with_every_epoch_restored_sends_them_all(two_epochs_backed_up):
    with runs.start_run("all restored", params={}, tags={}, patience=PATIENCE) as run_id:
        tracked_epochs(run_id, two_epochs_backed_up, 2, lambda tracked: tracked.on_train_end())  # fit ran no epoch
    assert [(m.step, m.timestamp) for m in mlflow.MlflowClient().get_metric_history(run_id, "loss")] == [
        (1, STAMP + 1), (2, STAMP + 2)]
