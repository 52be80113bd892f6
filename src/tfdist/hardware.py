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


class CpuMeter:
    """Mean CPU utilisation of this whole machine over a block, as MLflow's ``system/cpu_utilization_percentage``.

    Machine-wide, not this process's: a local multi-worker run's workers and
    parameter servers are other processes on the same cores. 100 means every
    core busy for the whole block.
    """

    def __enter__(self) -> CpuMeter:
        self._start = psutil.cpu_times()
        self.percent = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        busy_start, total_start = _busy_and_total(self._start)
        busy_end, total_end = _busy_and_total(psutil.cpu_times())
        total = total_end - total_start
        self.percent = 100.0 * (busy_end - busy_start) / total if total > 0 else 0.0


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
