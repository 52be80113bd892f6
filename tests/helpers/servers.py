"""Servers a test starts and stops: free loopback ports, and an MLflow server served until it answers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfdist.cluster import ports

from helpers.project import local_mode_environment


def free_ports(count: int = 1) -> list[int]:
    """``count`` distinct loopback ports free now, held in the port book for this test process: a local launcher
    of the other test worker is never given one (:func:`tfdist.cluster.ports.free_ports`)."""
    return ports.free_ports(count)


def session_commands(leader: int) -> list[str]:
    """The command lines of every process in the session ``leader`` started (a server started by :func:`serving`)."""
    commands = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.getsid(int(pid)) == leader:
                commands.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " "))
    return commands


def assert_no_job_runners(server: subprocess.Popen) -> None:
    """MLflow's GenAI job consumers (huey), which tfdist's servers leave off, did not start."""
    runners = [command for command in session_commands(server.pid) if "huey" in command]
    assert not runners, f"MLflow's job runners started beside the server: {runners}"


@contextlib.contextmanager
def serving(command: list[str], cwd: Path, url: str, env: dict[str, str] | None = None,
            timeout: float = 90) -> Iterator[subprocess.Popen]:
    """Run an MLflow server ``command`` (``tfdist ui``, ``tfdist server``) until its ``/health`` says OK; stop it after.

    Its output (stdout and stderr) goes to a file, ``process.output()`` reads
    it (a pipe nobody reads would stop a server that logs a traceback per failed
    request once it filled); a server that dies or does not answer within
    ``timeout`` fails the test with it.
    """
    env = {**local_mode_environment(), "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}",
           **(env or {})}
    log = tempfile.NamedTemporaryFile(prefix="server-", suffix=".log", delete=False)
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    process.output = lambda: Path(log.name).read_text(errors="replace")
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.read() == b"OK":
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                pytest.fail(f"no MLflow server came up at {url}:\n{process.output()[-3000:]}")
            time.sleep(0.5)
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
        os.unlink(log.name)


