"""A Ray cluster on test hosts, started as a user starts one on the machines of a cluster.

``ray start --head`` on host 0 and ``ray start --address`` on the others, each
with its host's address and one CPU, each a ``--block`` process of its host (so
stopping it stops what it started, and ``ray stop``, which would kill any other
Ray on this machine, is never needed). The cluster's token is given to every
node, and must be given to every driver (:data:`TOKEN`), as a user gives it to
each machine. Used by tests/cluster/test_ray_hosts.py and benchmarks/engines.py.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from helpers import netns
from helpers.project import REPO

RAY = str(Path(sys.executable).parent / "ray")
PORT = 6379
#: Seconds a Ray node may take to start on a loaded 2-core machine (about 10 s measured).
NODE_START_TIMEOUT = 90
#: The cluster's authentication token (``ray start`` turns token authentication on; ~/.ray/auth_token would be
#: shared with other tests' clusters).
TOKEN = {"RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_AUTH_MODE": "token"}
_LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayNodes:
    """A Ray node on each of ``hosts``' first ``count`` hosts; :attr:`address` is the head's ``host:port``."""

    def __init__(self, hosts: netns.TestHosts, root: Path, count: int = 2, cpus: Sequence[int] = ()):
        self.hosts, self.root, self.count = hosts, root, count
        self.cpus = list(cpus) or [1] * count  # each node's CPUs
        self.address = f"{hosts.addresses[0]}:{PORT}"
        self.nodes: list[subprocess.Popen] = []
        self._temps: list[str] = []

    def __enter__(self) -> RayNodes:
        try:
            self.nodes.append(self._start(0))
            deadline = time.monotonic() + NODE_START_TIMEOUT
            while subprocess.run([*self.hosts.enter(0), sys.executable, "-c",
                                  f"import socket; socket.create_connection(('{self.hosts.addresses[0]}', {PORT}), 1)"],
                                 capture_output=True).returncode:
                assert self.nodes[0].poll() is None and time.monotonic() < deadline, self.log(0)
                time.sleep(0.5)
            self.nodes += [self._start(host) for host in range(1, self.count)]
            self._wait_for_nodes()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self, host: int) -> str:
        return (self.root / f"ray-node-{host}.log").read_text()[-3000:]

    def _start(self, host: int) -> subprocess.Popen:
        role = ["--head", f"--port={PORT}", "--include-dashboard=false"] if host == 0 else [f"--address={self.address}"]
        # A short folder of its own: Ray's sockets live under it, and a socket's path has at most 107 bytes
        # (pytest's temp folders under xdist are longer than that leaves room for).
        temp = tempfile.mkdtemp(prefix=f"tfdist-ray-{host}-", dir="/tmp")
        self._temps.append(temp)
        command = [RAY, "start", "--block", *role, f"--node-ip-address={self.hosts.addresses[host]}",
                   f"--num-cpus={self.cpus[host]}", "--disable-usage-stats", f"--temp-dir={temp}"]
        env = {**os.environ, **TOKEN, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "2"}
        env.pop(_LOOPBACK_ONLY, None)
        return self.hosts.start(host, command, env, REPO, self.root / f"ray-node-{host}.log")

    def kill_raylet(self, host: int) -> None:
        """SIGKILL host ``host``'s raylet, as a crash would (its ``ray start --block`` then stops the node's rest)."""
        pids = subprocess.run(["ip", "netns", "pids", self.hosts.names[host]], capture_output=True, text=True,
                              timeout=30).stdout.split()
        raylets = [int(pid) for pid in pids if _command_name(pid) == "raylet"]
        assert raylets, f"no raylet on host {host}"
        for pid in raylets:
            os.kill(pid, signal.SIGKILL)
        self.nodes[host].wait(timeout=60)

    def restart(self, host: int) -> None:
        """Start host ``host``'s node again (a new node on the same address), and wait until the head counts it."""
        self.nodes[host] = self._start(host)
        self._wait_for_nodes()

    def _wait_for_nodes(self) -> None:
        """Until the head's cluster counts every node live (``ray status`` on the head's host), bounded."""
        deadline = time.monotonic() + NODE_START_TIMEOUT
        while True:
            for host, node in enumerate(self.nodes):
                assert node.poll() is None, self.log(host)
            status = subprocess.run([*self.hosts.enter(0), RAY, "status",
                                     f"--address={self.address}"], capture_output=True, text=True, timeout=60,
                                    env={**os.environ, **TOKEN})
            if status.returncode == 0 and len(re.findall(r"^\s*1 node_", status.stdout, re.M)) >= self.count:
                return
            assert time.monotonic() < deadline, f"{self.count} Ray nodes never came up:\n{status.stdout}{status.stderr}"
            time.sleep(2)

    def stop(self) -> None:
        for node in self.nodes:  # ray start --block stops what it started
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)
        for node in self.nodes:
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
        for temp in self._temps:
            shutil.rmtree(temp, ignore_errors=True)


def _command_name(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # it ended meanwhile
        return ""
