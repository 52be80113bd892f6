"""Cluster specs: which tasks a multi-process run has, and which one this process is.

Pure parsing, no processes and no TensorFlow: reads ``TF_CONFIG`` (set by
Kubeflow's TFJob, the Ray launcher or a person), or a Kubeflow Trainer v2 JobSet
pod's environment (:func:`read_jobset`), into a :class:`ClusterTask`.
Whether the cluster fits a strategy is :func:`check_cluster`'s
question; a Slurm step is :mod:`tfdist.cluster.slurm`'s (it needs TensorFlow's
resolver); starting processes is :mod:`tfdist.cluster.launcher`'s job.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfdist.errors import InputError

if TYPE_CHECKING:
    from tfdist.distribute.registry import StrategySpec

TF_CONFIG = "TF_CONFIG"
_JOBS = ("chief", "worker", "ps", "evaluator")


class ClusterError(InputError):
    """A malformed TF_CONFIG, or a cluster that does not fit the strategy (exit 2)."""


@dataclass(frozen=True)
class ClusterTask:
    """One task of a cluster: the cluster spec and which task this process is.

    Attributes:
        cluster: job name -> list of ``host:port``, as in TF_CONFIG.
        task_type: ``chief``, ``worker`` or ``ps``.
        task_index: index within its job.
    """

    cluster: Mapping[str, list[str]]
    task_type: str
    task_index: int

    @property
    def name(self) -> str:
        """``worker-1``: how logs and errors name the task."""
        return f"{self.task_type}-{self.task_index}"

    @property
    def is_chief(self) -> bool:
        """The task that writes outputs and logs to MLflow: ``chief``, else worker 0."""
        if "chief" in self.cluster:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    def count(self, job: str) -> int:
        return len(self.cluster.get(job, []))

    def to_tf_config(self) -> str:
        return json.dumps({"cluster": dict(self.cluster), "task": {"type": self.task_type, "index": self.task_index}})

    @property
    def hosts(self) -> list[str]:
        """The distinct host names of the cluster's tasks, in order."""
        return list(dict.fromkeys(address.rpartition(":")[0] for addresses in self.cluster.values() for address in addresses))


def parse_tf_config(text: str, source: str = TF_CONFIG) -> ClusterTask:
    """Parse and check a TF_CONFIG JSON document.

    Raises:
        ClusterError: naming what is wrong and where (``source``).
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ClusterError(f"{source} is not valid JSON ({err.msg} at character {err.pos})") from None
    if not isinstance(doc, dict):
        raise ClusterError(f"{source} must be a JSON object with 'cluster' and 'task', got {type(doc).__name__}")
    cluster, task = doc.get("cluster"), doc.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterError(f"{source}: 'cluster' must map job names to lists of host:port, got {cluster!r}")
    for job, addresses in cluster.items():
        if job not in _JOBS:
            raise ClusterError(f"{source}: unknown job {job!r} in 'cluster'; jobs are {', '.join(_JOBS)}")
        if not isinstance(addresses, list) or not addresses:
            raise ClusterError(f"{source}: cluster.{job} must be a non-empty list of host:port, got {addresses!r}")
        for address in addresses:
            _check_address(source, job, address)
    if not isinstance(task, dict):
        raise ClusterError(f"{source}: 'task' must be an object like {{\"type\": \"worker\", \"index\": 0}}, got {task!r}")
    task_type, index = task.get("type"), task.get("index", 0)
    if not isinstance(task_type, str) or task_type not in cluster:
        raise ClusterError(f"{source}: task.type {task_type!r} is not a job of the cluster ({', '.join(cluster)})")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cluster[task_type]):
        raise ClusterError(
            f"{source}: task.index {index!r} is out of range for job {task_type!r} "
            f"({len(cluster[task_type])} task(s): 0..{len(cluster[task_type]) - 1})"
        )
    return ClusterTask({job: list(addrs) for job, addrs in cluster.items()}, task_type, index)


def _check_address(source: str, job: str, address: Any) -> None:
    host, sep, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"{source}: cluster.{job} address {address!r} must look like host:port, e.g. worker-0:2222")


def read_tf_config(environ: Mapping[str, str] | None = None) -> ClusterTask | None:
    """The task TF_CONFIG names, or None when it is unset or blank (local mode)."""
    text = (os.environ if environ is None else environ).get(TF_CONFIG, "")
    return parse_tf_config(text) if text.strip() else None


#: The cluster of a JobSet (Kubeflow Trainer v2 TrainJob): TF job -> replicated job and pod count,
#: e.g. ``chief=chief:1,worker=node:2,ps=ps:1``; set in the runtime's pod template.
JOBSET_JOBS = "TFDIST_JOBSET_JOBS"
#: This pod's JobSet and replicated job, from its labels (the downward API), and its index in that job.
JOBSET_NAME, REPLICATED_JOB, COMPLETION_INDEX = "TFDIST_JOBSET_NAME", "TFDIST_REPLICATED_JOB", "JOB_COMPLETION_INDEX"
#: The port every task of a JobSet listens on (each pod has its own address).
JOBSET_PORT = 2222


def read_jobset(environ: Mapping[str, str] | None = None) -> ClusterTask | None:
    """The task a Kubeflow Trainer v2 pod is, from its JobSet environment; None outside one.

    JobSet names each pod ``<jobset>-<replicated job>-<job index>-<pod index>`` in the
    DNS subdomain ``<jobset>``: with one job per replicated job, task ``i`` of a TF
    job is pod ``i`` of its replicated job, at ``<jobset>-<replicated job>-0-<i>.<jobset>``.

    Raises:
        ClusterError: a variable is missing or malformed, naming it.
    """
    environ = os.environ if environ is None else environ
    layout = environ.get(JOBSET_JOBS, "").strip()
    if not layout:
        return None
    jobs: dict[str, tuple[str, int]] = {}
    for item in layout.split(","):
        job, _, where = item.strip().partition("=")
        replicated, _, count = where.partition(":")
        if job not in _JOBS or not replicated or not count.isdigit() or int(count) < 1:
            raise ClusterError(f"{JOBSET_JOBS}: {item.strip()!r} must look like <tf job>=<replicated job>:<pods>, "
                               f"e.g. worker=node:2 (tf jobs: {', '.join(_JOBS)})")
        jobs[job] = (replicated, int(count))
    missing = [name for name in (JOBSET_NAME, REPLICATED_JOB, COMPLETION_INDEX) if not environ.get(name)]
    if missing:
        raise ClusterError(f"{JOBSET_JOBS} is set but {', '.join(missing)} is not: set it in the pod template "
                           "(examples/kubeflow/trainjob-*.yaml show how)")
    jobset, mine, index = environ[JOBSET_NAME], environ[REPLICATED_JOB], environ[COMPLETION_INDEX]
    cluster = {job: [f"{jobset}-{replicated}-0-{i}.{jobset}:{JOBSET_PORT}" for i in range(count)]
               for job, (replicated, count) in jobs.items()}
    task_type = next((job for job, (replicated, _) in jobs.items() if replicated == mine), None)
    if task_type is None:
        raise ClusterError(f"{REPLICATED_JOB} {mine!r} is not a replicated job of {JOBSET_JOBS} ({layout})")
    return parse_tf_config(json.dumps({"cluster": cluster, "task": {"type": task_type, "index": int(index)}}),
                           source=f"{JOBSET_JOBS} of pod {jobset}-{mine}-0-{index}")


def tasks_of(cluster: Mapping[str, list[str]]) -> list[ClusterTask]:
    """Every task of ``cluster``, chief first, then workers, then ps."""
    order = sorted(cluster, key=_JOBS.index)
    return [ClusterTask(cluster, job, i) for job in order for i in range(len(cluster[job]))]


def describe_cluster(cluster: Mapping[str, list[str]]) -> str:
    """``2 workers, 1 ps``: a cluster in words, for logs."""
    return ", ".join(f"{len(addrs)} {job}{'s' if job == 'worker' and len(addrs) > 1 else ''}" for job, addrs in cluster.items())


def check_cluster(task: ClusterTask, spec: StrategySpec) -> None:
    """Refuse a cluster ``spec`` cannot run on, naming the job that is wrong.

    The strategy's record says which jobs it needs (``cluster_jobs``) and which
    it refuses (``forbidden_jobs``); no cluster may have an evaluator or more than one chief.

    Raises:
        ClusterError: naming the job and the fix.
    """
    jobs = set(task.cluster)
    if "evaluator" in jobs:
        raise ClusterError(f"{TF_CONFIG}: job 'evaluator' is not supported; the evaluate stage evaluates the model")
    if task.count("chief") > 1:
        raise ClusterError(f"{TF_CONFIG}: cluster.chief must list one task, got {task.count('chief')}")
    for job in spec.forbidden_jobs:
        if job in jobs:
            raise ClusterError(f"{TF_CONFIG}: {spec.name} takes no {job!r} job; drop cluster.{job} or use another strategy")
    missing = [" or ".join(choices) for choices in spec.cluster_jobs if not jobs & set(choices)]
    if missing:
        needed = ", ".join(" or ".join(choices) for choices in spec.cluster_jobs)
        raise ClusterError(f"{TF_CONFIG}: {spec.name} needs jobs {needed}; missing {', '.join(missing)}")

