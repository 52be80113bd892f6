"""A training run's phases, top-down, as each task plays them: build, fit, save, record.

The chief (or only process) joins, reads, fits, saves the model, logs it and
the summary, and writes the stage's outputs as its MLflow run ends; another
worker of a cluster joins, reads and fits beside it. Between phases each
passes the moments a test can kill the stage at (:mod:`tfdist.crash_points`),
in :data:`tfdist.crash_points.CRASH_POINTS`' order: the phases are here, so are
their moments, and the backup's and the outputs' own are handed ``crash_point``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from tfdist.cluster.launcher import SCRATCH_ENV
from tfdist.config.knobs import Config
from tfdist.crash_points import crash_point
from tfdist.distribute.cluster_spec import ClusterTask
from tfdist.distribute.registry import StrategySpec
from tfdist.files import atomic
from tfdist.hardware import CpuMeter
from tfdist.records.reports import TrainOutputs
from tfdist.records.run_names import RunPaths
from tfdist.resume.checkpoints import set_aside_if_damaged
from tfdist.train.chief_run import ChiefRun
from tfdist.train.fit import weights_digest
from tfdist.train.task_run import TaskRun

log = logging.getLogger(__name__)


def train_chief(config: Config, spec: StrategySpec, name: str, paths: RunPaths, task: ClusterTask | None) -> TrainOutputs:
    """The chief (or only process): build, fit, save and record; the stage's outputs.

    A damaged backup is set aside before the cluster is joined: the other
    workers build their strategy, and read the backup, only once the chief
    has joined, so none restores from it.
    """
    trainer = TaskRun(config, spec, name, paths, task)
    abandoned = None
    if all(path.is_file() for path in trainer.data_files):  # else :meth:`TaskRun.load` names what is missing
        trainer.key = trainer.run_key()  # hashes the prepared data: once, kept for load
        abandoned = set_aside_if_damaged(paths.backups / name / trainer.key, spec.backup)
    trainer.start()
    crash_point("train.strategy")
    trainer.load()
    crash_point("train.data")
    recorder = ChiefRun(config, spec, name, paths, trainer)
    recorder.open(abandoned)
    with recorder.recording(moments=crash_point) as recording:
        with CpuMeter(recorder.training_root) as cpu:
            result = trainer.fit([recording.epochs], moments=crash_point)
        saved = recording.save_model(result)
        crash_point("model.written")
        recording.log_model(saved)
        crash_point("model.logged")
        trained = recording.summarize(result, saved, cpu)
        crash_point("run.summary")
    return trained


def train_worker(config: Config, spec: StrategySpec, name: str, paths: RunPaths, task: ClusterTask) -> None:
    """A cluster's worker other than the chief: train beside it (the collectives need it), keep a record outside the
    stage outputs."""
    trainer = TaskRun(config, spec, name, paths, task)
    trainer.start()
    crash_point("train.strategy")
    trainer.load()
    crash_point("train.data")
    result = trainer.fit(record_backup=False, moments=crash_point)
    digest = weights_digest(result.model)
    root = os.environ.get(SCRATCH_ENV) or tempfile.mkdtemp(prefix="tfdist-scratch-")
    path = Path(root) / name / f"{task.name}.json"
    atomic.write_json(path, {"task": task.name, "weights_sha256": digest, "history": result.history})
    log.info("%s: final weights sha256 %s; not the chief, so saved only %s", task.name, digest, path)
