"""What a training process ran on: CPU, cores, GPUs, TPUs, hosts.

Recorded in every train report, so that the compare stage reasons from the
machines where training ran, not from the one running compare (on a cluster
they differ). Reads ``/proc/cpuinfo``; the devices come from the training
process (no TensorFlow here: the compare stage reads this without it).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tfdist.records.measures import measure

#: Host names that mean "this machine" in a cluster spec.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class Hardware:
    """The hardware of one training run, as seen by its chief (or only) process.

    Attributes:
        hosts: the distinct machines the run's processes ran on: the host names
            of its cluster spec, or this machine's name for a one-process run.
        cpu_cores: logical CPUs of the chief's machine.
        cpu_model: the chief's CPU model name ("" where unknown).
        device_kinds: kinds of accelerator or CPU device the chief's process had
            (``CPU``, ``GPU``, ``TPU``): the ones its replicas ran on.
        gpu_models: the chief's GPU model names (empty without GPUs).
    """

    hosts: list[str]
    cpu_cores: int
    cpu_model: str = ""
    device_kinds: list[str] = field(default_factory=lambda: ["CPU"])
    gpu_models: list[str] = field(default_factory=list)

    @property
    def shared_cpu(self) -> bool:
        """True when every replica or process ran on the CPU cores of one machine."""
        return len(self.hosts) == 1 and self.device_kinds == ["CPU"]


def describe(device_kinds: list[str], gpu_models: list[str], cluster_hosts: list[str] | None = None) -> Hardware:
    """This machine, with the devices its training process found, and the hosts of its cluster spec (if any).

    Loopback addresses in a cluster spec mean this machine, named by its host name.
    """
    hosts = [platform.node()]
    if cluster_hosts:
        local = any(host in LOCAL_HOSTS for host in cluster_hosts)
        hosts = ([platform.node()] if local else []) + [host for host in cluster_hosts if host not in LOCAL_HOSTS]
    return Hardware(hosts, os.cpu_count() or 1, cpu_model(), list(device_kinds), list(gpu_models))


#: A training is flagged as disturbed where the host took at least this much of the machine's CPU time
#: (steal: a VM's host giving its cores to another guest), or other programs used at least this much of it.
STEAL_DISTURBS_PERCENT = 5.0
OTHERS_DISTURB_PERCENT = 10.0


@dataclass(frozen=True)
class MachineNoise:
    """What the machine gave a training while it trained, besides the training: the noise under its timings.

    Attributes:
        steal_percent: of the machine's CPU time, what its host took (``steal`` in /proc/stat: a VM's
            hypervisor running another guest on its cores).
        others_percent: of the machine's CPU time, what programs other than the training's own processes used.
        usable_cpus: the CPUs the training's process could run on (its affinity).
    """

    steal_percent: float = field(metadata=measure(mlflow="machine_steal_percent"))
    others_percent: float = field(metadata=measure(mlflow="machine_others_percent"))
    usable_cpus: int = field(metadata=measure(mlflow="usable_cpus"))

    @property
    def disturbed(self) -> bool:
        return bool(self.what())

    def what(self) -> str:
        """What disturbed it, in words ("" where nothing did)."""
        found = []
        if self.steal_percent >= STEAL_DISTURBS_PERCENT:
            found.append(f"the host took {self.steal_percent:.0f}% of the machine's CPU time (steal)")
        if self.others_percent >= OTHERS_DISTURB_PERCENT:
            found.append(f"other programs used {self.others_percent:.0f}% of it")
        return " and ".join(found)


class CpuMeter:
    """Mean CPU utilisation of this whole machine over a block, as MLflow's ``system/cpu_utilization_percentage``,
    and what of it was not the training's (:class:`MachineNoise`).

    Machine-wide, not this process's: a local multi-worker run's workers and
    parameter servers are other processes on the same cores. 100 means every
    core busy for the whole block. The training's own processes are ``root``
    (a pid; this process by default: give a local launcher's pid to count its
    other tasks as the training's) and everything it started.
    """

    def __init__(self, root: int | None = None):
        self.root = root or os.getpid()

    def __enter__(self) -> CpuMeter:
        self._start = psutil.cpu_times()
        self._own_start = _tree_cpu_seconds(self.root)
        self.percent = 0.0
        self.own_seconds = 0.0  # CPU seconds of the training's processes over the block
        self.noise: MachineNoise | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        end = psutil.cpu_times()
        busy_start, total_start = _busy_and_total(self._start)
        busy_end, total_end = _busy_and_total(end)
        total = total_end - total_start
        if total <= 0:
            return
        self.percent = 100.0 * (busy_end - busy_start) / total
        own_end = _tree_cpu_seconds(self.root)
        self.own_seconds = own = sum(seconds - self._own_start.get(pid, 0.0) for pid, seconds in own_end.items())
        steal = steal_seconds(end) - steal_seconds(self._start)
        others = max(0.0, busy_end - busy_start - steal - own)
        self.noise = MachineNoise(round(100 * steal / total, 2), round(100 * others / total, 2), len(usable_cpus()))


def steal_seconds(times: Any = None) -> float:
    """CPU time the VM's host gave other guests since boot (``steal`` in /proc/stat; 0 where the OS has none),
    of ``times`` (a ``psutil.cpu_times()``) or now."""
    return float(getattr(times if times is not None else psutil.cpu_times(), "steal", 0.0))


def _tree_cpu_seconds(root: int) -> dict[int, float]:
    """CPU seconds of ``root`` and every process it started, by pid: each one's own and its ended children's."""
    try:
        parent = psutil.Process(root)
        tree = [parent, *parent.children(recursive=True)]
    except psutil.Error:
        return {}
    found = {}
    for process in tree:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        found[process.pid] = times.user + times.system + times.children_user + times.children_system
    return found


def _busy_and_total(times: Any) -> tuple[float, float]:
    """CPU seconds busy and in all, as psutil counts them (guest time is inside user time on Linux)."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total


def _cpuinfo_field(name: str, cpuinfo: Path) -> str:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith(name):
            return line.partition(":")[2].strip()
    return ""


def usable_cpus() -> list[int]:
    """The CPUs this process may run on, in order: its affinity (``taskset``, Slurm, a container's cpuset)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as Linux reports it ("" elsewhere)."""
    return _cpuinfo_field("model name", cpuinfo)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU feature flags Linux reports (empty where there is no /proc/cpuinfo)."""
    return set(_cpuinfo_field("flags", cpuinfo).split())
