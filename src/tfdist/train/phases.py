"""A training run's phases, top-down, as a task that trains plays them: build, fit, save, record.

Every such task joins, reads and fits; the chief (or only process) then saves
the model, logs it and the summary, and writes the stage's outputs as its
MLflow run ends, while another worker of a cluster keeps a record outside them. Between phases each
passes the moments a test can kill the stage at (:mod:`tfdist.crash_points`),
in :data:`tfdist.crash_points.CRASH_POINTS`' order: the phases are here, so are
their moments, and the backup's and the outputs' own are handed ``crash_point``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tfdist import native_logs
from tfdist.cluster import slurm
from tfdist.config.knobs import Config
from tfdist.crash_points import crash_point
from tfdist.distribute.cluster_spec import ClusterTask
from tfdist.distribute.registry import StrategySpec
from tfdist.hardware import CpuMeter
from tfdist.records.reports import TrainOutputs
from tfdist.records.run_names import RunPaths
from tfdist.tf_private import reset_eager_context
from tfdist.train.chief_run import ChiefRun
from tfdist.train.task_run import TaskRun


def train_task(config: Config, spec: StrategySpec, name: str, paths: RunPaths, task: ClusterTask | None
               ) -> TrainOutputs | None:
    """A task that trains: build, fit, and, in the chief (or only process), save and record; the stage's outputs.

    Every such task plays the same phases up to ``fit``, as in the keras-io
    distributed guide; only the chief records the run and writes the outputs,
    another worker keeps a record outside them (None).
    """
    chief = task is None or task.is_chief
    with _coordinating(spec, task):
        trainer = TaskRun(config, spec, name, paths, task)
        abandoned = trainer.set_aside_if_damaged() if chief else None
        trainer.start()
        crash_point("train.strategy")
        trainer.load()
        crash_point("train.data")
        if not chief:
            trainer.fit_beside_chief(moments=crash_point)
            return None
        recorder = ChiefRun(trainer)
        recorder.open(abandoned)
        with recorder.recording(moments=crash_point) as recording:
            with CpuMeter(recorder.training_root) as cpu:
                result = trainer.fit([recording.epochs], moments=crash_point)
            saved, digest = recording.save_model(result)
            crash_point("model.written")
            recording.log_model(saved)
            crash_point("model.logged")
            recording.log_traces(trainer.profile_root, result)
            trainer.remove_own_scratch()
            trained = recording.summarize(result, digest, cpu)
            crash_point("run.summary")
        return trained


@contextlib.contextmanager
def _coordinating(spec: StrategySpec, task: ClusterTask | None) -> Iterator[None]:
    """Around a coordinated strategy's chief: its servers are let go of, and stopped in a Slurm step.

    The chief drops its connections to the servers before they are stopped:
    dropped now, the errors of deleting functions on servers that are gone
    (lost mid-training, or stopped) are filtered out; at exit they would not
    be. When training failed, TensorFlow's native gRPC errors about the lost
    servers are muted, so the one-line error stays the last word.
    """
    if task is None or not spec.coordinated:
        yield
        return
    try:
        yield
        reset_eager_context()
    except BaseException:
        native_logs.mute_native_stderr()
        raise
    finally:
        if slurm.in_slurm_step():  # its servers never end on their own, and a step ends with its last task
            slurm.stop_step_servers()
