"""Test hosts: network namespaces on this machine, each its own host with its own address, on one bridge.

A real network between a cluster's tasks without a second machine: every
host is a namespace with a veth cable (``eth0``, ``10.213.0.<i+1>/24``) into a
bridge namespace, the switch. There is no route out, so traffic stays among
these hosts; each host's loopback is its own. :meth:`TestHosts.cut` unplugs
a host's cable at the switch (its packets vanish, as when a link fails, rather
than being refused), :meth:`TestHosts.mend` plugs it back.

Needs root and iproute2 (``ip netns``): CI runs as root; elsewhere the tests skip.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

SUBNET = "10.213.0"
_names = itertools.count()


def available() -> str:
    """Why test hosts cannot be made here, or '' when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    probe = f"tfdprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


class TestHosts:
    """``count`` hosts on one switch; :meth:`close` (or the ``with`` block's end) removes them and their processes."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, count: int):
        tag = f"tfd{os.getpid() % 100000}x{next(_names)}"  # interface names have at most 15 characters
        self.switch = f"{tag}-sw"
        self.names = [f"{tag}-h{i}" for i in range(count)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(count)]
        self._ports = [f"{tag}p{i}" for i in range(count)]
        self._processes: list[subprocess.Popen] = []
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "add", "sw0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "sw0", "up")
            for name, address, port in zip(self.names, self.addresses, self._ports, strict=True):
                _ip("netns", "add", name)
                _ip("-n", name, "link", "set", "lo", "up")
                _ip("link", "add", f"{port}h", "type", "veth", "peer", "name", port)
                _ip("link", "set", f"{port}h", "netns", name)
                _ip("link", "set", port, "netns", self.switch)
                _ip("-n", name, "link", "set", f"{port}h", "name", "eth0")
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
                _ip("-n", self.switch, "link", "set", port, "master", "sw0", "up")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> TestHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, host: int, command: Sequence[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
        """Run ``command`` on host ``host``, its output (stdout and stderr) into ``log``."""
        with open(log, "w") as out:
            process = subprocess.Popen(["ip", "netns", "exec", self.names[host], *command], cwd=cwd, env=env,
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._processes.append(process)
        return process

    def cut(self, host: int) -> None:
        """Unplug host ``host``'s cable at the switch: from now on its packets are lost, none refused."""
        _ip("-n", self.switch, "link", "set", self._ports[host], "down")

    def mend(self, host: int) -> None:
        _ip("-n", self.switch, "link", "set", self._ports[host], "up")

    def close(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        for name in [*self.names, self.switch]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
