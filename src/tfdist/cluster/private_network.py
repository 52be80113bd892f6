"""Servers in a network of their own: reachable from no other host and no other local user.

TensorFlow's gRPC task servers bind every interface, whatever address the
cluster spec names, and run any graph a client sends them (tensorflow#11689:
"designed to run on private networks"). So the local launcher gives its cluster
a private network: it runs itself again inside a new network namespace
(``unshare --net``; unprivileged, inside a user namespace of its own where the
kernel allows it) whose only interface is its own loopback. Its tasks inherit
it: they see each other on 127.0.0.1 and nothing outside sees them.

What the chief must still reach outside (an MLflow server, an S3 endpoint on
this machine's loopback) is relayed: inside, the launcher listens on the same
``host:port`` and passes each connection through a Unix socket (in a 0700
folder: files, unlike ports, cross namespaces) to a relay process left outside,
which connects to the real address. A service on another host cannot be relayed
that way; the cluster then stays on the machine's network, with a warning that
names its ports (:func:`tfdist.cluster.launcher.warn_open_ports`).

The other way round serves ``tfdist s3``: SeaweedFS's master, volume server and
filer answer anyone who reaches their ports, keys or not. :func:`start_inside`
runs it in a private network under a keeper process that passes connections from
Unix sockets to its ports inside; outside, only the S3 port is listened on
(:func:`relay_in`), and tfdist alone talks to the master, through its socket.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from tfdist import native_logs

log = logging.getLogger(__name__)

#: Set inside the namespace: the relays' addresses and Unix sockets (JSON), and a sign the launcher is in.
INSIDE_ENV = "TFDIST_PRIVATE_NETWORK"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
#: What each scheme connects to by default, where its URI names no port.
DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "mysql": 3306, "mssql": 1433}
#: Bound on the relay's start-up: it is a Python process that imports nothing heavy.
RELAY_START_SECONDS = 30.0
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


@dataclass(frozen=True)
class Relay:
    """One address the cluster reaches outside: listened on inside, passed through ``socket_path``."""

    host: str
    port: int
    socket_path: str


def outside_addresses(uris: Sequence[str]) -> list[tuple[str, int]]:
    """The ``(host, port)`` each URI connects to over TCP; none for files, sqlite, or a Unix-socket database."""
    addresses = []
    for uri in filter(None, uris):
        parts = urlsplit(uri)
        scheme = parts.scheme.split("+")[0]
        if scheme not in DEFAULT_PORTS or not parts.hostname:
            continue
        addresses.append((parts.hostname, parts.port or DEFAULT_PORTS[scheme]))
    return addresses


def why_not_private(addresses: Sequence[tuple[str, int]]) -> str | None:
    """Why the cluster cannot have a private network here, or None when it can."""
    remote = [f"{host}:{port}" for host, port in addresses if host not in LOOPBACK_NAMES]
    if remote:
        return f"it must reach {', '.join(remote)} on another host, which a private network cannot relay"
    if unshare_command() is None:
        return "this kernel refuses new network namespaces to this user (unshare --net, and inside a user namespace)"
    return None


@functools.cache
def unshare_command() -> list[str] | None:
    """The command prefix that starts a program in a new network namespace here, tried once; None where none works."""
    candidates = [["unshare", "--net"]] if os.geteuid() == 0 else []
    candidates.append(["unshare", "--user", "--map-root-user", "--net"])
    for prefix in candidates:
        try:
            if subprocess.run([*prefix, "--", "true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def inside() -> bool:
    """Whether this process is a launcher that already runs in its private network."""
    return INSIDE_ENV in os.environ


def run_inside(command: Sequence[str], addresses: Sequence[tuple[str, int]]) -> None:
    """Replace this process by ``command`` in a new network namespace, with relays for ``addresses``. Never returns.

    Same pid (DVC keeps waiting on it): ``unshare`` execs the command once the
    namespace exists. The relay process stays outside, as this process's child,
    and ends when this process does.
    """
    prefix = unshare_command()
    assert prefix is not None, "why_not_private() said it could"
    relays = []
    if addresses:
        folder = tempfile.mkdtemp(prefix="tfdist-relay-")  # 0700: only the owner may connect to its sockets
        relays = [Relay(host, port, os.path.join(folder, f"{i}.sock")) for i, (host, port) in enumerate(addresses)]
        _start_relay(relays)
    os.environ[INSIDE_ENV] = json.dumps([[r.host, r.port, r.socket_path] for r in relays])
    native_logs.exec_program(shutil.which(prefix[0]) or prefix[0], [*prefix, "--", *command])


def settle_inside() -> None:
    """In the new namespace: bring its loopback up and listen on each relayed address."""
    _loopback_up()
    for host, port, socket_path in json.loads(os.environ.get(INSIDE_ENV) or "[]"):
        relay_in(host, port, socket_path)
    log.info("local mode: the cluster runs in a private network (its task servers are reachable from no other host)")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _start_relay(relays: Sequence[Relay]) -> None:
    spec = json.dumps([[r.host, r.port, r.socket_path] for r in relays])
    subprocess.Popen([sys.executable, "-m", "tfdist.cluster.private_network", spec, str(os.getpid())],
                     stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + RELAY_START_SECONDS
    while not all(os.path.exists(r.socket_path) for r in relays):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the relay to {relays[0].host}:{relays[0].port} did not start within "
                               f"{RELAY_START_SECONDS:.0f} s")
        time.sleep(0.02)


def _unix(path: str) -> socket.socket:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(path)
    return connection


def _accept(listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
    """Pass every connection ``listener`` takes to a new one from ``connect()``, both ways, until either closes."""
    while True:
        client, _ = listener.accept()
        try:
            upstream = connect()
        except OSError:
            client.close()
            continue
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until ``source`` ends, then end ``sink``'s writing (the other direction goes on); on an error, end both."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        for end in (sink, source):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


def start_inside(command: Sequence[str], ports: dict[str, int], **popen: object) -> subprocess.Popen:
    """Start ``command`` in a new private network, each of ``ports`` (Unix socket path -> port inside) reachable
    through its socket once the socket exists. The caller checks :func:`unshare_command` first."""
    prefix = unshare_command()
    assert prefix is not None, "checked by the caller"
    keeper = [sys.executable, "-m", "tfdist.cluster.private_network", "keep", json.dumps(ports), "--", *command]
    process = subprocess.Popen([*prefix, "--", *keeper], **popen)  # type: ignore[call-overload]
    deadline = time.monotonic() + RELAY_START_SECONDS
    while not all(os.path.exists(path) for path in ports):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{command[0]} did not start in a private network (exit {process.poll()})")
        time.sleep(0.02)
    return process


def relay_in(host: str, port: int, socket_path: str) -> socket.socket:
    """Listen on ``host:port`` here and pass each connection to the Unix socket ``socket_path``."""
    listener = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    threading.Thread(target=_accept, args=(listener, lambda: _unix(socket_path)), name=f"relay-in-{port}",
                     daemon=True).start()
    return listener


def relay_out(socket_path: str, host: str, port: int) -> None:
    """Listen on the Unix socket ``socket_path`` (in a 0700 folder: only the owner reaches it) and pass each
    connection to ``host:port``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    threading.Thread(target=_accept, args=(listener, lambda: socket.create_connection((host, port), 30)),
                     name=f"relay-out-{port}", daemon=True).start()


def _keep(spec: str, command: Sequence[str]) -> int:
    """Inside the new namespace: loopback up, each Unix socket to its port here, then ``command`` until it ends."""
    _loopback_up()
    for socket_path, port in json.loads(spec).items():
        relay_out(socket_path, "127.0.0.1", port)
    child = subprocess.Popen(list(command))
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda received, _: child.send_signal(received))
    return child.wait()


def _serve_relays(spec: str, parent: int) -> None:
    """The relay outside: each Unix socket to its TCP address, until the launcher (``parent``) is gone."""
    for signum in (signal.SIGINT, signal.SIGTERM):  # the launcher's stop reaches its group: it may still need us
        signal.signal(signum, signal.SIG_IGN)
    for host, port, socket_path in json.loads(spec):
        relay_out(socket_path, host, port)
    while os.getppid() == parent:
        time.sleep(1)
    for _, _, socket_path in json.loads(spec):
        with contextlib.suppress(OSError):
            os.unlink(socket_path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(json.loads(spec)[0][2]))


if __name__ == "__main__":
    if sys.argv[1] == "keep":
        sys.exit(_keep(sys.argv[2], sys.argv[4:]))
    _serve_relays(sys.argv[1], int(sys.argv[2]))
