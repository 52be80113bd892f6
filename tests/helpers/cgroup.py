"""cgroup v1 controllers as the suite's limits use them: mounted under /sys/fs/cgroup, written as root."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def unavailable(controller: str, knob: str) -> str:
    """Why groups of ``controller`` cannot be limited here (``knob`` is the file a limit writes), or '' when they
    can."""
    if os.geteuid() != 0:
        return f"cgroup {controller} limits need root"
    if not (ROOT / controller / knob).is_file():
        return f"cgroup v1's {controller} controller is not mounted at {ROOT / controller}"
    return ""
