"""One process's line of /proc/<pid>/stat, read in one place for the benchmarks that measure processes.

Stdlib only: benchmarks/suite_cpu.py's plugin half imports it in every pytest process.
"""

from __future__ import annotations

from dataclasses import dataclass
from os import sysconf
from pathlib import Path

TICKS = sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessStat:
    """A process's parent, session, start (clock ticks since boot: with the pid, it names one process) and CPU time."""

    ppid: int
    session: int
    started: str
    cpu_seconds: float


def process_stat(pid: int | str) -> ProcessStat:
    """``pid``'s stat line (user + system CPU); OSError once it is gone."""
    line = Path(f"/proc/{pid}/stat").read_text()
    fields = line[line.rindex(")") + 2:].split()  # after the command name, which may hold spaces and brackets
    return ProcessStat(int(fields[1]), int(fields[3]), fields[19], (int(fields[11]) + int(fields[12])) / TICKS)
