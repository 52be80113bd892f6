"""A memory limit for a process and its children: a cgroup v1 ``memory`` group, its peak and its OOM kills.

Needs root and cgroup v1's ``memory`` controller mounted at /sys/fs/cgroup/memory
(design.md). The page cache of the files a group reads and writes is charged to
it too, and reclaimed under the limit; a process's own memory is not, and past
the limit the kernel kills it (``oom_kill``).
"""

from __future__ import annotations

import itertools
import os

from helpers import cgroup

MEMORY_CONTROLLER = cgroup.ROOT / "memory"
_names = itertools.count()


def available() -> str:
    """Why memory limits cannot be set here, or '' when they can."""
    return cgroup.unavailable("memory", "memory.limit_in_bytes")


class MemoryLimit:
    """At most ``limit`` bytes for the processes :meth:`wrap` starts (their children with them); :meth:`close` removes
    the group."""

    def __init__(self, limit: int):
        self.group = MEMORY_CONTROLLER / f"tfdist-memory-{os.getpid()}-{next(_names)}"
        self.group.mkdir()
        (self.group / "memory.limit_in_bytes").write_text(str(limit))
        if (self.group / "memory.memsw.limit_in_bytes").exists():  # no swap to escape to
            (self.group / "memory.memsw.limit_in_bytes").write_text(str(limit))

    def wrap(self, command: list[str]) -> list[str]:
        """``command`` run inside the group."""
        return ["sh", "-c", f'echo $$ > {self.group}/cgroup.procs && exec "$@"', "sh", *command]

    @property
    def peak(self) -> int:
        """The most the group held at once, page cache included (bytes)."""
        return int((self.group / "memory.max_usage_in_bytes").read_text())

    @property
    def oom_kills(self) -> int:
        """Processes of the group the kernel killed for memory."""
        fields = dict(line.split() for line in (self.group / "memory.oom_control").read_text().splitlines())
        return int(fields.get("oom_kill", 0))

    def close(self) -> None:
        """Remove the group; its processes must have ended."""
        if self.group.exists():
            self.group.rmdir()
