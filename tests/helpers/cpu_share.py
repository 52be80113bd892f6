"""A share of the CPU for a process and its children: a cgroup v1 ``cpu`` group with a CFS quota, and a pin.

An emulated machine smaller than a core: the process is pinned to one CPU
(``taskset``) and its group may run a share of every CFS period there. The
period is 10 ms, not the kernel's default 100 ms: a step of a few milliseconds
then meets its throttling every few steps, as a slower core would slow it,
instead of running at full speed for 50 ms and stopping for 50 (a stall the
other machines' all-reduce would wait for). Needs root and cgroup v1's ``cpu``
controller mounted at /sys/fs/cgroup/cpu (design.md).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from helpers import cgroup

CPU_CONTROLLER = cgroup.ROOT / "cpu"
PERIOD_US = 10_000
_names = itertools.count()


def available() -> str:
    """Why CPU shares cannot be set here, or '' when they can."""
    return cgroup.unavailable("cpu", "cpu.cfs_quota_us")


class CpuShare:
    """``cores`` worth of CPU time on the CPUs ``cpus`` (None: any); :meth:`close` removes its group.

    ``CpuShare({0}, 0.5)`` is half a core on CPU 0; ``CpuShare(None, 1.0)`` one
    core's time however the group's processes spread over the CPUs (a local
    launcher pinning two tasks to a CPU each: half a core each). No quota when
    ``cores`` covers the CPUs.
    """

    def __init__(self, cpus: set[int] | None, cores: float):
        self.cpus, self.cores = cpus, cores
        self.group: Path | None = None
        if cores < len(cpus or os.sched_getaffinity(0)):
            self.group = CPU_CONTROLLER / f"tfdist-share-{os.getpid()}-{next(_names)}"
            self.group.mkdir()
            (self.group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.group / "cpu.cfs_quota_us").write_text(str(round(cores * PERIOD_US)))

    def wrap(self, command: list[str]) -> list[str]:
        """``command`` run pinned to the CPUs and, under a quota, inside the group (its children with it)."""
        pinned = ["taskset", "-c", ",".join(map(str, sorted(self.cpus))), *command] if self.cpus else command
        if self.group is None:
            return pinned
        return ["sh", "-c", f'echo $$ > {self.group}/cgroup.procs && exec "$@"', "sh", *pinned]

    def close(self) -> None:
        """Remove the group; the processes in it must have ended (the kernel keeps a group that has any)."""
        if self.group is not None and self.group.exists():
            self.group.rmdir()

    def __enter__(self) -> CpuShare:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
