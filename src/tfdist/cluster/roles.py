"""Which role a train stage process plays: launcher of a cluster, one of its tasks, or the only process.

* **only process**: a single-process strategy trains in it (a cluster in the
  environment is ignored, with a warning);
* **launcher**: a multi-process strategy and no cluster in the environment:
  :func:`launch` starts one task process per task, on this machine
  (:mod:`tfdist.cluster.launcher`) or where Ray places them
  (:mod:`tfdist.cluster.ray_launcher`), and waits for them; it never trains;
* **task**: the one :func:`this_task` names, from ``TF_CONFIG``, a Kubeflow
  Trainer (JobSet) pod, or a Slurm step, in that order. Under a coordinated
  strategy (parameter_server) the chief trains and the other tasks
  :func:`serve`; otherwise every task trains.

No TensorFlow here (a Slurm step's resolver imports it when asked): a
launcher starts its tasks in a blink.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

from tfdist.cluster import slurm
from tfdist.config.knobs import DistributedConfig
from tfdist.distribute.cluster_spec import TF_CONFIG, ClusterTask, check_cluster, describe_cluster, read_jobset, read_tf_config
from tfdist.distribute.registry import StrategySpec

log = logging.getLogger(__name__)


def this_task(spec: StrategySpec, distributed: DistributedConfig) -> ClusterTask | None:
    """The cluster task this process is under ``spec``, checked against it; None for a launcher or the only process.

    Raises:
        ClusterError: a malformed cluster, or one ``spec`` cannot run on (:func:`tfdist.distribute.cluster_spec.check_cluster`).
    """
    task = read_tf_config() or read_jobset()
    if not spec.multi_process:
        if task is not None:
            log.warning("%s is set but strategy %s runs in one process: ignoring it", TF_CONFIG, spec.name)
        return None
    if task is None and slurm.in_slurm_step():
        task = slurm.read_slurm(spec, distributed)
        log.info("Slurm step: task %s of %s is %s", os.environ["SLURM_PROCID"], os.environ["SLURM_STEP_NUM_TASKS"],
                 task.name)
    if task is not None:
        check_cluster(task, spec)
        log.info("cluster mode: this process is %s of %s", task.name, describe_cluster(task.cluster))
    return task


def launches(spec: StrategySpec, task: ClusterTask | None) -> bool:
    """Whether this process starts the cluster: a multi-process strategy with no cluster in the environment."""
    return spec.multi_process and task is None


def serves(spec: StrategySpec, task: ClusterTask) -> bool:
    """Whether ``task`` only serves (a coordinated strategy's worker or ps): its chief runs the steps on it."""
    return spec.coordinated and task.task_type != "chief"


def launch(spec: StrategySpec, distributed: DistributedConfig, command: Sequence[str],
           on_stop: Callable[[str], None], outside: Sequence[str] = ()) -> None:
    """Run ``command`` as every task of ``spec``'s cluster, restarting it per ``distributed.max_restarts``.

    Args:
        command: the stage command that runs as one task of the cluster (its role read from ``TF_CONFIG``).
        on_stop: told ``FAILED`` or ``KILLED`` when an attempt ends early, to close what its chief left open.
        outside: URIs the tasks reach beyond the cluster (the tracking store, an S3 endpoint).
    """
    if distributed.launcher == "ray":
        from tfdist.cluster.ray_launcher import launch_ray  # Ray, an optional extra, only where asked for

        return launch_ray(spec, distributed, command, on_stop=on_stop)
    from tfdist.cluster.launcher import launch_local

    return launch_local(spec, distributed, command, on_stop=on_stop, outside=outside)
