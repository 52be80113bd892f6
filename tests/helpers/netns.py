"""Test hosts: network namespaces on this machine, each its own host with its own address, on one bridge.

A real network between a cluster's tasks without a second machine: every
host is a namespace with a veth cable (``eth0``, ``10.213.0.<i+1>/24``) into a
bridge namespace, the switch. There is no route out, so traffic stays among
these hosts; each host's loopback is its own. Every host knows every other
by name, as on a real network: its /etc/hosts (``/etc/netns/<host>/hosts``,
which ``ip netns exec`` mounts over /etc/hosts) lists them all. :meth:`TestHosts.cut` unplugs
a host's cable at the switch (its packets vanish, as when a link fails, rather
than being refused), :meth:`TestHosts.mend` plugs it back.

Needs root and iproute2 (``ip netns``): CI runs as root; elsewhere the tests skip.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

SUBNET = "10.213.0"
#: Where ``ip netns exec`` finds the files it mounts over /etc in a namespace.
NAMES_ROOT = Path("/etc/netns")
LINK_PORT = 2299

#: Echoes ``pings`` one-byte messages, then reads ``size`` bytes and answers one byte.
_LINK_SERVER = f"""
import socket, sys
size, pings = int(sys.argv[1]), int(sys.argv[2])
listener = socket.create_server(("0.0.0.0", {LINK_PORT}))
connection, _ = listener.accept()
connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(pings):
    connection.sendall(connection.recv(1))
left = size
while left:
    left -= len(connection.recv(min(left, 1 << 20)))
connection.sendall(b"!")
"""

#: Times the pings (median round trip) and the transfer (until the server's answer).
_LINK_CLIENT = f"""
import json, socket, statistics, sys, time
address, size, pings = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if len(sys.argv) > 4:  # a ring of clients: all start at this wall-clock time, so that their transfers overlap
    time.sleep(max(0.0, float(sys.argv[4]) - time.time()))
deadline = time.monotonic() + 30
while True:
    try:
        connection = socket.create_connection((address, {LINK_PORT}), timeout=5)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
trips = []
for _ in range(pings):
    start = time.perf_counter()
    connection.sendall(b"x")
    connection.recv(1)
    trips.append(time.perf_counter() - start)
start = time.perf_counter()
connection.sendall(bytes(size))
connection.recv(1)
seconds = time.perf_counter() - start
print(json.dumps({{"round_trip_us": 1e6 * statistics.median(trips), "mbit_per_s": 8 * size / seconds / 1e6}}))
"""
_names = itertools.count()
#: A machine's own view, in private mounts and hostname: its /etc/hosts and name (the rest of /etc and /sys are this box's).
_AS_MACHINE = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'


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
            names = "".join(f"{address} {name}\n" for name, address in zip(self.names, self.addresses, strict=True))
            for name in self.names:
                folder = NAMES_ROOT / name
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> TestHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, host: int, command: Sequence[str], env: dict[str, str], cwd: Path, log: Path, *,
              outside: Sequence[str] = (), as_machine: bool = False) -> subprocess.Popen:
        """Run ``command`` on host ``host``, its output (stdout and stderr) into ``log``.

        ``outside``: a command to enter the host through, run before the
        namespace is (e.g. a CPU share's, which writes to the cgroup files that
        ``ip netns exec``'s own /sys does not show). ``as_machine``: run it as
        on a machine of its own, for daemons that check: the host's name as its
        hostname, and this machine's /sys with its cgroups (Slurm's daemons use them).
        """
        with open(log, "w") as out:
            process = subprocess.Popen([*outside, *self.enter(host, as_machine=as_machine), *command], cwd=cwd,
                                       env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._processes.append(process)
        return process

    def enter(self, host: int, *, as_machine: bool = False) -> list[str]:
        """The command prefix that runs a command on host ``host`` (see :meth:`start` for ``as_machine``)."""
        name = self.names[host]
        if not as_machine:
            return ["ip", "netns", "exec", name]
        return ["nsenter", f"--net=/run/netns/{name}", "unshare", "--mount", "--uts", "--", "sh", "-c", _AS_MACHINE,
                "sh", str(NAMES_ROOT / name / "hosts"), name]

    def shape(self, rate: str | None, burst: str = "16kb") -> None:
        """Shape every cable, both ways, to ``rate`` (``tc`` tbf, e.g. ``1gbit``); None takes the shaping off.

        tbf shapes what a device sends, so each cable gets it at the host's end
        and at the switch's. veth hands tbf segments of up to 64 KiB (GSO), which
        a small bucket cannot pass and a big one lets through at full speed (a
        step's few hundred KB would then mostly skip the shaping), so shaped
        cables send plain 1,500-byte packets (``gso_max_size``; ethtool is not
        installed) through a 16 KB bucket. No delay can be added: these kernels
        have no netem (design.md).
        """
        segments = ("1500", "1") if rate else ("65536", "65535")
        for name, port in zip(self.names, self._ports, strict=True):
            for namespace, device in ((name, "eth0"), (self.switch, port)):
                _ip("-n", namespace, "link", "set", "dev", device, "gso_max_size", segments[0], "gso_max_segs", segments[1])
                tc = ["ip", "netns", "exec", namespace, "tc", "qdisc"]
                if rate is None:
                    subprocess.run([*tc, "del", "dev", device, "root"], capture_output=True, timeout=30)
                    continue
                done = subprocess.run([*tc, "replace", "dev", device, "root", "tbf", "rate", rate, "burst", burst,
                                       "latency", "50ms"], capture_output=True, text=True, timeout=30)
                if done.returncode:
                    raise RuntimeError(f"tc tbf on {namespace} {device}: {done.stderr.strip()}")

    def measure_link(self, sender: int, receiver: int, size: int = 8_000_000, pings: int = 200) -> dict[str, float]:
        """The link from host ``sender`` to ``receiver`` as TCP sees it: round trip (median, µs) and rate (Mbit/s)."""
        (found,) = self._transfers([(sender, receiver)], size, pings)
        return found

    def measure_ring(self, count: int, size: int = 32_000_000, pings: int = 200) -> dict[str, float]:
        """The links of the first ``count`` hosts as a ring all-reduce loads them: each sends to the next at once.

        Every host's cable, the switch and their tbf queues are processed by
        this machine's few cores, so several transfers at once each get less
        than one alone would: this is the rate (median over the ring's links,
        Mbit/s) and round trip (median, µs) each link had with all of them busy.
        """
        if count < 2:
            raise ValueError("a ring needs 2 hosts or more")
        found = self._transfers([(i, (i + 1) % count) for i in range(count)], size, pings)
        return {key: statistics.median(link[key] for link in found) for key in ("round_trip_us", "mbit_per_s")}

    def _transfers(self, links: list[tuple[int, int]], size: int, pings: int) -> list[dict[str, float]]:
        """Each (sender, receiver) link's pings and transfer, all at the same time: what each measured."""
        servers = [subprocess.Popen(["ip", "netns", "exec", self.names[receiver], sys.executable, "-c", _LINK_SERVER,
                                     str(size), str(pings)], stdout=subprocess.PIPE, text=True) for _, receiver in links]
        try:
            # Several links: every client starts at once, a second from now (all started and connected by then).
            start = [str(time.time() + 1.0)] if len(links) > 1 else []
            clients = [subprocess.Popen(["ip", "netns", "exec", self.names[sender], sys.executable, "-c", _LINK_CLIENT,
                                         self.addresses[receiver], str(size), str(pings), *start],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                       for sender, receiver in links]
            found = []
            for client in clients:
                out, err = client.communicate(timeout=120)
                if client.returncode:
                    raise RuntimeError(f"measuring the link failed: {err.strip()[-500:]}")
                found.append(json.loads(out))
            return found
        finally:
            for server in servers:
                server.kill()
                server.wait(timeout=30)

    def cut(self, host: int) -> None:
        """Unplug host ``host``'s cable at the switch: from now on its packets are lost, none refused."""
        _ip("-n", self.switch, "link", "set", self._ports[host], "down")

    def fail(self, host: int) -> None:
        """Host ``host`` fails as a machine does: its cable unplugged (:meth:`cut`), every process on it killed at once."""
        self.cut(host)
        pids = subprocess.run(["ip", "netns", "pids", self.names[host]], capture_output=True, text=True, timeout=30)
        for pid in pids.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def mend(self, host: int) -> None:
        _ip("-n", self.switch, "link", "set", self._ports[host], "up")

    def close(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        for name in [*self.names, self.switch]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            shutil.rmtree(NAMES_ROOT / name, ignore_errors=True)


def wait_for(log: Path, text: str, process: subprocess.Popen | None = None, timeout: float = 120) -> None:
    """Until ``text`` is in ``log`` (a test host's process writes it), at most ``timeout`` s; failing early if
    ``process`` ended without it."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert process is None or process.poll() is None, f"{log.name}'s process ended without {text!r}:\n" \
            f"{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in {log.name} after {timeout} s:\n{log.read_text()[-2000:]}"
        time.sleep(0.2)
