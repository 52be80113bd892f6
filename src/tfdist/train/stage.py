"""The train stage's entry: which role this process plays in a training run, and playing it.

* **only process**: a single-process strategy trains here (a TF_CONFIG is ignored, with a warning);
* **cluster task** (cluster mode: TF_CONFIG set, a Kubeflow Trainer JobSet pod,
  or one of several tasks of a Slurm step): the task it is: the chief
  trains, tracks and writes the outputs; another worker trains; a
  parameter_server worker or ps serves until stopped (:mod:`tfdist.train.server`,
  TensorFlow without tf_keras);
* **local launcher** (a multi-process strategy, no TF_CONFIG): starts the
  cluster as processes on 127.0.0.1 (:mod:`tfdist.cluster.launcher`) and, where the
  strategy says so, coordinates training as its chief; or, with
  ``distributed.launcher: ray``, has Ray place and start them (:mod:`tfdist.cluster.ray_launcher`).

The training modules are imported where a role trains, not at the top: the
multi_worker_mirrored launcher only waits for its workers, and must not pay
TensorFlow's and MLflow's seconds of import before it starts them. Ray, an
optional extra, is imported only under ``distributed.launcher: ray``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from tfdist.cluster import launcher, slurm
from tfdist.config import Config
from tfdist.distribute import cluster_spec
from tfdist.distribute.cluster_spec import ClusterTask
from tfdist.distribute.registry import StrategySpec, check_pipeline, get_spec
from tfdist.errors import InputError
from tfdist.reports import RunPaths, TrainOutputs
from tfdist.runtime import configure_runtime
from tfdist.tracking.object_store import MLFLOW_ENDPOINT_ENV
from tfdist.train.checks import check_cluster, check_config
from tfdist.train.resume import backups_of
from tfdist.workspace import private_folder

log = logging.getLogger(__name__)


def train(config: Config, *, strategy_name: str, name: str, paths: RunPaths, launch: Sequence[str] = ()
          ) -> TrainOutputs | None:
    """Train one model under ``strategy_name`` as MLflow run ``name``, in whatever role this process has.

    Every epoch is backed up under ``paths.backups`` (see :mod:`tfdist.train.resume`):
    run again after a crash with the same params, training resumes where it stopped.

    Args:
        launch: the command that runs this same stage as one task of a local cluster.

    Returns:
        The report and history for the process that writes the stage outputs;
        None for any other (a non-chief worker, a server, or a launcher whose
        chief worker wrote them).
    """
    spec = get_spec(strategy_name)  # resolved once: everything below is handed the record
    private_folder(paths.backups, key="--backups")  # the run's weights and optimizer state: the owner's alone
    check_pipeline(config.distributed.strategies)
    check_config(spec, config)
    task = _cluster_task(spec, config)
    if task is None and spec.multi_process:
        if not launch:
            raise InputError(f"strategy {spec.name} without {cluster_spec.TF_CONFIG} needs a launch command for its tasks")
        stop = lambda status: _close_chief_run(config, paths, name, status)  # noqa: E731
        if config.distributed.launcher == "ray":
            from tfdist.cluster.ray_launcher import launch_ray

            launch_ray(spec, config.distributed, launch, on_stop=stop)
            return None
        return launcher.launch_local(
            spec, config.distributed, launch,
            coordinate=lambda chief: _coordinate(config, spec, name, paths, chief),
            on_stop=stop, outside=(config.mlflow.tracking_uri, os.environ.get(MLFLOW_ENDPOINT_ENV, "")),
        )
    if not spec.multi_process:
        configure_runtime(config, _replicas(config, spec))
        if task is not None:
            log.warning("%s is set but strategy %s runs in one process: ignoring it", cluster_spec.TF_CONFIG, spec.name)
        return _run(config, spec, name, paths, None)
    assert task is not None  # a multi-process strategy without a task launched its cluster above
    check_cluster(task, spec)
    log.info("cluster mode: this process is %s of %s", task.name, launcher.describe_cluster(task.cluster))
    if spec.launcher_trains and task.task_type != "chief":
        from tfdist.train.server import serve  # TensorFlow without tf_keras: a server builds no model

        serve(task, config)
        return None
    if spec.launcher_trains:  # parameter_server's chief coordinates, as under the local launcher
        try:
            return _coordinate(config, spec, name, paths, task)
        finally:
            if slurm.in_slurm_step():  # its servers never end on their own, and a step ends with its last task
                slurm.stop_step_servers()
    configure_runtime(config, _replicas(config, spec))
    return _run(config, spec, name, paths, task)


def _replicas(config: Config, spec: StrategySpec) -> int:
    """The replicas this process holds: its ``runtime:`` threads are resolved for them."""
    return config.distributed.devices if spec.distributes and not spec.multi_process else 1


def _cluster_task(spec: StrategySpec, config: Config) -> ClusterTask | None:
    """The task this process is: from TF_CONFIG, a Kubeflow Trainer (JobSet) pod, or a Slurm step, in that order."""
    task = cluster_spec.read_tf_config() or cluster_spec.read_jobset()
    if task is None and spec.multi_process and slurm.in_slurm_step():
        task = slurm.read_slurm(spec, config.distributed)
        log.info("Slurm step: task %s of %s is %s", os.environ["SLURM_PROCID"], os.environ["SLURM_STEP_NUM_TASKS"],
                 task.name)
    return task


def _run(config: Config, spec: StrategySpec, name: str, paths: RunPaths, task: ClusterTask | None) -> TrainOutputs | None:
    """Train in this process: the chief's run tracks and reports, another worker's only trains."""
    if task is None or task.is_chief:
        from tfdist.train.chief_run import ChiefRun

        return ChiefRun(config, spec, name, paths, task).run()
    from tfdist.train.task_run import TaskRun

    return TaskRun(config, spec, name, paths, task).run()


def _coordinate(config: Config, spec: StrategySpec, name: str, paths: RunPaths, chief: ClusterTask) -> TrainOutputs | None:
    """A coordinating chief: train, then drop the connections to the workers before they are stopped.

    TensorFlow is first imported here, under the local launcher once the other
    tasks have started: they import it meanwhile, instead of waiting for
    this process to. Dropped now, the errors of deleting functions on workers
    that are gone (lost mid-training, or stopped) are filtered out; at exit
    they would not be.
    """
    configure_runtime(config, _replicas(config, spec))
    from tfdist.tf_private import reset_eager_context

    outputs = _run(config, spec, name, paths, chief)
    reset_eager_context()
    return outputs


def _close_chief_run(config: Config, paths: RunPaths, name: str, status: str) -> None:
    """Close the MLflow run a stopped chief left RUNNING; its backup names the run.

    A chief stopped after another task failed may have ended its run KILLED
    (the launcher's SIGTERM is all it saw): the run failed, and says FAILED.
    """
    run_ids = [backup.run_id for backup in backups_of(paths.backups, name) if backup.run_id]
    if not run_ids:
        return
    from tfdist.tracking import experiment, runs

    experiment.configure(config.mlflow)
    for run_id in run_ids:
        if runs.close_if_running(run_id, status, overriding=("KILLED",) if status == "FAILED" else ()):
            log.info("marked MLflow run %s %s: its chief was stopped before it could", run_id, status)

