"""The chief's recording: what only the process that writes the stage's outputs does around the trainer's fit.

:func:`tfdist.train.phases.train_task` hands the chief's started and loaded
:class:`tfdist.train.task_run.TaskRun` to a :class:`ChiefRun`, which:

1. :meth:`ChiefRun.open`: points tracking at the store, checked before training so a bad URI fails in seconds;
2. :meth:`ChiefRun.recording`: holds the MLflow run open around the trainer's fit, each epoch sent as it is backed up;
3. :class:`Recording`: saves the model as a float32 copy, logs (and registers) it per params, builds the typed train
   report with the hardware where training ran, and logs its summary; the outputs land as the run ends.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tfdist.cluster.launcher import SCRATCH_ENV
from tfdist.config.knobs import MIXED_PRECISIONS
from tfdist.config.params import to_flat_dict
from tfdist.data.prepared import prepared_digest, scaled
from tfdist.distribute.cluster_spec import ClusterTask, tasks_of
from tfdist.files import atomic
from tfdist.hardware import CpuMeter, Hardware, describe, usable_cpus
from tfdist.records.history import write_history
from tfdist.records.measures import mlflow_metrics
from tfdist.records.reports import PrecisionSupport, ThreadSettings, TrainOutputs, TrainReport, to_dict, write_report
from tfdist.records.run_names import PROFILE_FOLDER, run_label
from tfdist.resume import rerun
from tfdist.resume.checkpoints import Moments
from tfdist.resume.outbox import MetricsOutbox, TrackedEpochs
from tfdist.runtime.allocator import allocator_in_use
from tfdist.tf_imports import keras, tf
from tfdist.tf_private import onednn_in_use
from tfdist.tracking import experiment, models, runs
from tfdist.tracking.models import SavedModel
from tfdist.tracking.outage import Patience, StoreUnreachable
from tfdist.tracking.store import redact
from tfdist.train.callbacks import Diverged
from tfdist.train.checks import applied_compression
from tfdist.train.fit import TrainResult, weights_digest
from tfdist.train.models import export_copy
from tfdist.train.precision import HardwareSupport, announce, hardware_support
from tfdist.train.profiling import traces
from tfdist.train.step_costs import Costs, step_costs
from tfdist.train.task_run import TaskRun
from tfdist.train.trace_parts import traced_parts

log = logging.getLogger(__name__)

_END = "the run's end (FINISHED)"
#: What a run lacks when the store stopped answering at each of its last writes, in their order
#: (the epochs' metrics are named by epoch, from what the outbox still holds).
_MISSING_AFTER = {
    "the model": ("the model", "the summary metrics", _END),
    "the model version's tags": ("the model version's tags", "the summary metrics", _END),
    "the traces": ("the traces", "the summary metrics", _END),
    "the summary metrics": ("the summary metrics", _END),
    "the epochs' metrics": (_END,),
    _END: (_END,),
}


@dataclass
class Recording:
    """One MLflow run being recorded: where the epochs go, the staged outputs, and the run's measures."""

    recorder: ChiefRun
    run_id: str
    outputs: atomic.Outputs
    outbox: MetricsOutbox
    patience: Patience
    support: HardwareSupport
    trained: TrainOutputs | None = None
    #: The step's parts read from the workers' traces (TrainReport's ``traced_*`` fields), where a cluster was profiled.
    traced: dict[str, Any] | None = None

    @property
    def epochs(self) -> TrackedEpochs:
        """The callback that hands each backed-up epoch to the run."""
        return TrackedEpochs(self.outbox, self.recorder.backup)

    def save_model(self, result: TrainResult) -> tuple[SavedModel, str]:
        """Save the trained weights as a float32 model in the outputs' staging (not yet logged); their digest."""
        recorder = self.recorder
        self.patience.restart_clock()
        model = export_copy(result.model, recorder.config.model, recorder.data)
        digest = weights_digest(model)
        log.info("%s: final weights sha256 %s", recorder.task.name if recorder.task else recorder.name, digest)
        saved = models.save_model(model, self.outputs.stage(recorder.paths.model),
                                  example=scaled(recorder.train_split.read(5).x))
        return saved, digest

    def log_model(self, saved: SavedModel) -> None:
        """Log the saved model to the run and register it, per params; a run that holds it already is not given
        a second one, nor a second version (:func:`tfdist.resume.rerun.logged_model`)."""
        mlflow, train = self.recorder.config.mlflow, self.recorder.config.train
        if not mlflow.log_models:
            return
        register_as = mlflow.registered_model if mlflow.register_models else None
        logged, version = self.patience.call(lambda: rerun.logged_model(register_as), "the model")
        if not logged:
            version = models.log_model(saved, register_as=register_as, patience=self.patience)
        if register_as and version is not None:
            models.tag_version(register_as, version, {"strategy": self.recorder.info.name,
                                                      "run_name": self.recorder.name, "loop": train.loop,
                                                      "precision": train.precision}, self.patience)

    def log_traces(self, root: Path, result: TrainResult) -> None:
        """Log every task's trace found under ``root`` to the run (``profile/<task>/...``, TensorBoard's layout) and
        tag it with what was captured; a task whose trace is not there (on its own host) is named in one line."""
        recorder = self.recorder
        if not recorder.config.train.profile_steps:
            return
        found = traces(root)
        tasks = sorted({trace.relative_to(root).parts[0] for trace in found})
        if missing := [task for task in training_tasks(recorder.task, recorder.spec.coordinated) if task not in tasks]:
            log.warning("profiling: no trace of %s under %s (written on another host?)", ", ".join(missing), root)
        if not found:
            return
        self.patience.call(lambda: runs.log_folder(root, PROFILE_FOLDER), "the traces")
        self.patience.call(lambda: runs.set_tags({"tfdist.profiled": f"{result.profiled_steps} steps of epoch "
                                                                     f"{result.profiled_epoch}: {', '.join(tasks)}"}),
                           "the traces")
        log.info("profiling: %d traces (%s) logged to MLflow run %s under %s/", len(found), ", ".join(tasks),
                 self.run_id, PROFILE_FOLDER)
        workers = [trace for trace in found if trace.relative_to(root).parts[0].startswith(("chief", "worker"))]
        if len(workers) >= 2 and not recorder.spec.coordinated:
            self.traced = traced_parts(workers[:2])

    def summarize(self, result: TrainResult, digest: str, cpu: CpuMeter) -> TrainOutputs:
        """Build the report of the weights ``digest`` names (or reuse the one a killed run recorded) and log its
        summary: what the stage writes once the run ends."""
        recorder = self.recorder
        report = rerun.recorded_report(recorder.backup, digest) or recorder.report(
            result, digest, self.run_id, self.support, cpu,
            step_costs(recorder.config, recorder.data, recorder.spec, recorder.info, result.model,
                       result.global_batch_size), self.traced)
        recorder.backup.save(report=to_dict(report))
        rerun.log_missing_metrics(mlflow_metrics(report), patience=self.patience)
        first, last = report.kernel_fallbacks
        if first:  # oneDNN's pass left a kernel to Eigen's: said beside the run's timings (the compare report too)
            self.patience.call(lambda: runs.set_tags({"tfdist.eigen_kernels": f"{first}; after "
                                                      f"{len(report.kernel_checks) - 1} retrace(s): {last or 'none'}"}),
                               "the kernels' tag")
        self.outbox.flush()
        self.trained = TrainOutputs(report, result.history)
        return self.trained


class ChiefRun:
    """Records a training run in MLflow, saves its model and reports it: the only process's, or a cluster's chief's.

    It is handed the run's trainer (:class:`~tfdist.train.task_run.TaskRun`),
    started and loaded; what the trainer's fit produces is handed to the
    :class:`Recording` it opens.
    """

    def __init__(self, trainer: TaskRun):
        self.config, self.spec, self.name, self.paths, self.task = (trainer.config, trainer.spec, trainer.name,
                                                                    trainer.paths, trainer.task)
        self.info, self.data, self.backup, self.stale = trainer.info, trainer.data, trainer.backup, trainer.stale
        self.train_split, self.val_split = trainer.train_split, trainer.val_split

    @contextmanager
    def recording(self, moments: Moments | None = None) -> Iterator[Recording]:
        """The run's MLflow run, open around training: the body fits, saves, logs and summarizes (:class:`Recording`).

        The model, and with ``paths.reports`` the report and history, are
        staged and renamed into place together, only once the run has recorded
        them and ended: a store that stops answering for good
        (:mod:`tfdist.tracking.outage`) or a full disk leaves every output as it
        was, and the backup keeps what a rerun needs to finish into the same run
        without training.
        """
        support = announce(self.config.train.precision)
        resumed_run_id = self.backup.run_id
        patience = Patience(self.config.mlflow.outage_timeout, redact(self.config.mlflow.tracking_uri))
        run_id, outbox = resumed_run_id, None
        try:
            with atomic.atomic_outputs(moments) as outputs, runs.start_run(
                    self.title, params=self.params(), tags=self.tags(support), resume_run_id=resumed_run_id,
                    parent_run_id=runs.execution_run(self.config), system_metrics=True, patience=patience) as run_id:
                self.backup.save(mlflow_run_id=run_id, name=self.name, strategy=self.spec.name, key=self.backup.folder.name)
                outbox = MetricsOutbox(run_id, patience)
                try:
                    if run_id != resumed_run_id:  # a resumed run has its input already
                        self.log_dataset()
                    recording = Recording(self, run_id, outputs, outbox, patience, support)
                    try:
                        yield recording
                    except Diverged as err:
                        runs.set_tags({"diverged.epoch": err.epoch, "diverged.step": err.step})
                        raise
                finally:
                    outbox.close()
                trained = recording.trained
                assert trained is not None, "the recording was finished"
                if self.paths.reports is not None:
                    write_history(self.paths.reports / "history" / f"{self.name}.csv", trained.history, outputs=outputs)
                    write_report(self.paths.reports / f"{self.name}.json", trained.report, outputs=outputs)
        except StoreUnreachable as err:
            unsent = outbox.unsent() if outbox else []
            raise StoreUnreachable(self.not_recorded(str(err), run_id, unsent, patience)) from None
        self.backup.remove()

    def not_recorded(self, stopped_at: str, run_id: str | None, unsent: list, patience: Patience) -> str:
        """The one line for a store that never came back: what it lacks, and that a rerun finishes the run."""
        missing = list(_MISSING_AFTER.get(stopped_at, _MISSING_AFTER["the model"]))
        if unsent:
            epochs = sorted({row[3] for row in unsent})
            missing.insert(0, f"the metrics of epoch{'s' if len(epochs) > 1 else ''} "
                              f"{epochs[0]}{f'-{epochs[-1]}' if len(epochs) > 1 else ''}")
        return (f"mlflow.tracking_uri {patience.shown} did not answer for {patience.timeout:.0f} s "
                f"(mlflow.outage_timeout); not recorded in MLflow run {run_id}: {', '.join(missing)}. Nothing is lost: "
                f"{self.backup.folder} keeps the trained weights and what was not sent; once the store answers, run "
                "this stage again and it finishes into the same run without training again")

    def open(self, abandoned_run_id: str | None = None) -> None:
        """Point tracking at the store (fails in seconds when it is bad); close the runs of backups set aside
        (``abandoned_run_id``: a damaged one's) and retire those of changed params."""
        experiment.configure(self.config.mlflow)
        rerun.retire_runs(abandoned_run_id, self.stale)

    @property
    def title(self) -> str:
        """The MLflow run name: what differs between runs."""
        info, train = self.info, self.config.train
        return run_label(self.name, strategy=info.name, replicas=info.replicas, workers=info.workers, ps=info.ps,
                         loop=train.loop, precision=train.precision, clip=train.clip.method,
                         compression=applied_compression(self.spec, self.config), distributes=self.spec.distributes)

    def params(self) -> dict[str, Any]:
        return {**to_flat_dict(self.config), "strategy": self.info.to_dict(), "tensorflow": tf.__version__,
                "tf_keras": keras.__version__}

    def tags(self, support: HardwareSupport) -> dict[str, str]:
        train = self.config.train
        return {
            "strategy": self.info.name, "stage": "train", "model_name": self.name,
            "synchronous": str(self.info.synchronous), "loop": train.loop, "precision": train.precision,
            "precision.can_be_faster": str(support.can_be_faster), "precision.hardware": support.reason,
            runs.EXECUTION_TAG: runs.execution_id(self.config),
        }

    def log_dataset(self) -> None:
        """The prepared data as the run's input, under the sha256 reports/data.json gives (test split included)."""
        runs.log_dataset(name=self.data.name, sha256=prepared_digest(self.paths.prepared),
                         source=str(self.paths.prepared.resolve()), context="training", features=self.data.features,
                         records=len(self.train_split))

    @property
    def training_root(self) -> int | None:
        """The process whose tree is this training's (:class:`tfdist.hardware.CpuMeter`): the local launcher's, for its task."""
        return os.getppid() if self.task is not None and SCRATCH_ENV in os.environ else None

    def report(self, result: TrainResult, digest: str, run_id: str, support: HardwareSupport,
               cpu: CpuMeter, costs: Costs, traced: dict[str, Any] | None = None) -> TrainReport:
        """The typed train report: what the strategy resolved to, the knobs, what the fit and the step measured
        (``traced``: the step's parts from the workers' traces)."""
        info, train = self.info, self.config.train
        return TrainReport(
            name=self.name, strategy=info.name, paradigm=self.spec.paradigm, strategy_class=info.strategy_class,
            replicas=info.replicas, devices=list(info.devices), workers=info.workers, ps=info.ps,
            synchronous=info.synchronous, loop=train.loop, precision=train.precision,
            precision_can_be_faster=support.can_be_faster,
            precision_support={p: PrecisionSupport(found.can_be_faster, found.reason)
                               for p, found in ((p, hardware_support(p)) for p in MIXED_PRECISIONS)},
            run_label=self.title, clip_method=train.clip.method, clip_value=train.clip.value, lr_scaling=train.lr_scaling,
            base_learning_rate=train.learning_rate, **result.measured(), cpu_percent=cpu.percent, **asdict(costs),
            weights_sha256=digest, mlflow_run_id=run_id, tensorflow=tf.__version__,
            hardware=detect_hardware(self.task.hosts if self.task else None),
            threads=ThreadSettings(len(usable_cpus()), tf.config.threading.get_intra_op_parallelism_threads(),
                                   tf.config.threading.get_inter_op_parallelism_threads(), onednn_in_use()),
            machine=cpu.noise, dataset=self.data.describe(),
            gradient_compression=applied_compression(self.spec, self.config), allocator=allocator_in_use(),
            **(traced or {}),
        )


def training_tasks(task: ClusterTask | None, coordinated: bool) -> list[str]:
    """The names of the tasks that run ``fit`` (so capture their steps): a coordinated cluster's chief alone."""
    if task is None:
        return ["main"]
    if coordinated:
        return [task.name]
    return [peer.name for peer in tasks_of(task.cluster) if peer.task_type in ("chief", "worker")]


def detect_hardware(cluster_hosts: list[str] | None) -> Hardware:
    """This process's devices as TensorFlow sees them; ``cluster_hosts``: its cluster spec's hosts, if any."""
    gpus = tf.config.list_physical_devices("GPU")
    kinds = ["TPU"] if tf.config.list_logical_devices("TPU") else ["GPU"] if gpus else ["CPU"]
    models = [tf.config.experimental.get_device_details(gpu).get("device_name", "GPU") for gpu in gpus]
    return describe(kinds, models, cluster_hosts)
