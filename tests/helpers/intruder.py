"""Doors tried the way an intruder would: as another local user, with a browser's headers, from a test host.

Another local user is uid/gid 65534 (``nobody``), reached with ``setpriv``: it owns
none of the workspace and none of the owner's processes, as on a shared machine.
Only loopback and the suite's own test hosts are ever a target.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def http_status(url: str, *, method: str = "GET", headers: dict[str, str] | None = None, body: str | None = None,
                as_nobody: bool = False, prefix: Sequence[str] = ()) -> int:
    """The HTTP status ``url`` answers (0: no connection), asked with curl, optionally as another local user."""
    command = [*prefix, *(AS_NOBODY if as_nobody else ()), "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
               "--max-time", "10", "-X", method, url]
    for name, value in (headers or {}).items():
        command += ["-H", f"{name}: {value}"]
    if body is not None:
        command += ["-H", "Content-Type: application/json", "--data", body]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, cwd="/")
    return int(result.stdout.strip() or 0)


def readable_by_others(path: os.PathLike[str] | str) -> bool:
    """Whether another local user could read ``path``, a file or a folder's listing (tried, not computed from modes)."""
    reader = "ls" if os.path.isdir(path) else "cat"
    result = subprocess.run([*AS_NOBODY, reader, os.fspath(path)], capture_output=True, timeout=30, cwd="/")
    return result.returncode == 0
