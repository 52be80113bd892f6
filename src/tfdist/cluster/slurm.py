"""A Slurm job step as a cluster: which task this process is, from Slurm's environment.

Inside ``srun -n N`` (or an ``sbatch`` script's ``srun``), every task of the
step gets ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``, ``SLURM_STEP_NODELIST``
and ``SLURM_STEP_TASKS_PER_NODE``. TensorFlow's ``SlurmClusterResolver`` turns
them into a cluster spec (hosts from the node list, ports from
:data:`PORT_BASE` up on each node) and this task's place in it; the train stage
then runs as that task in cluster mode, exactly as with TF_CONFIG.

Layout: multi_worker_mirrored makes every task a worker (worker 0 is the
chief); parameter_server makes rank 0 the chief, the next ``distributed.ps``
the ps, and the rest workers (the resolver assigns ranks to jobs in name order).
A step of one task is not a cluster: the local launcher runs as usual.

parameter_server's servers (its ps and workers) run what the chief sends and
never end on their own, while a Slurm step lasts until its last task ends. So
the chief, done (trained or failed), stops them: ``scancel --signal=TERM`` on
its own step, which a server answers by exiting 0 (it has nothing to save) and
the chief ignores; the step then ends with the chief's exit code. A chief that
dies instead leaves that to ``srun --kill-on-bad-exit=1``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping

from tfdist.config.knobs import DistributedConfig
from tfdist.distribute.cluster_spec import ClusterError, ClusterTask
from tfdist.distribute.registry import StrategySpec

log = logging.getLogger(__name__)

#: The port of a node's first task; the next task on the same node takes the next port.
PORT_BASE = 8888
_STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")


def in_slurm_step(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is one of several tasks of a Slurm job step."""
    environ = os.environ if environ is None else environ
    return all(environ.get(name) for name in _STEP_VARIABLES) and int(environ["SLURM_STEP_NUM_TASKS"]) > 1


def read_slurm(spec: StrategySpec, distributed: DistributedConfig) -> ClusterTask:
    """This Slurm task's place in the cluster ``spec`` lays out over the step's tasks.

    Raises:
        ClusterError: the step has too few tasks for the layout, or Slurm's variables do not add up.
    """
    from tfdist.tf_imports import tf  # the resolver is TensorFlow's; only a Slurm task pays for the import here

    tasks = int(os.environ["SLURM_STEP_NUM_TASKS"])
    jobs = _layout(spec, distributed, tasks)
    gpus = _has_gpus()
    try:
        # With GPUs the resolver counts them and gives each task its share (CUDA_VISIBLE_DEVICES). Without,
        # it still deals one "GPU" slot per task: give it one each, and leave CUDA alone.
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            jobs=jobs, port_base=PORT_BASE, gpus_per_node=None if gpus else tasks, gpus_per_task=None if gpus else 1,
            auto_set_gpu=gpus)
        cluster = resolver.cluster_spec().as_dict()
    except (RuntimeError, ValueError) as err:
        raise ClusterError(f"Slurm step of {tasks} tasks: {err}") from None
    return ClusterTask({job: list(addresses) for job, addresses in cluster.items()}, resolver.task_type,
                       resolver.task_id)


def _layout(spec: StrategySpec, distributed: DistributedConfig, tasks: int) -> dict[str, int]:
    if not spec.has_ps:
        return spec.task_counts(tasks, 0)
    workers = tasks - 1 - distributed.ps
    if workers < 1:
        raise ClusterError(f"Slurm step of {tasks} tasks is too small for {spec.name}: it needs 1 chief, "
                           f"distributed.ps {distributed.ps} ps and at least 1 worker; run srun -n {distributed.ps + 2} "
                           "or more")
    return spec.task_counts(workers, distributed.ps)


def _has_gpus() -> bool:
    """Whether this node has NVIDIA GPUs the resolver can count (it runs nvidia-smi, which fails without them)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return bool(visible.strip())
    return shutil.which("nvidia-smi") is not None


#: Seconds scancel gets to hand the step's servers their SIGTERM.
STOP_TIMEOUT = 30


def stop_step_servers() -> None:
    """Stop the other tasks of this Slurm step (parameter_server's servers): SIGTERM to the step, this task excepted.

    Only the chief calls this, once done; it ignores the signal from then on.
    When scancel is missing or fails, the servers keep the step running: say
    how to end it.
    """
    step = f"{os.environ.get('SLURM_JOB_ID')}.{os.environ.get('SLURM_STEP_ID')}"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        done = subprocess.run(["scancel", "--signal=TERM", step], capture_output=True, text=True,
                              timeout=STOP_TIMEOUT)
        failure = (done.stderr.strip() or f"exit {done.returncode}") if done.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as err:
        failure = str(err)
    if failure:
        log.error("could not stop the step's servers (scancel: %s); end the step with scancel %s", failure, step)
    else:
        log.info("Slurm step %s: the chief is done and stopped its servers", step)
