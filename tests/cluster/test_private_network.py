"""The local launcher's task servers in a network of their own: tried from another host and as another local user.

TensorFlow's task servers bind every interface and run any graph sent to them;
under ``distributed.task_network: private`` (the default) nothing outside the
cluster reaches them. The machine here is a test host (tests/helpers/netns.py),
the intruder another one on the same switch, and a cluster kept on the host's
network on purpose (``task_network: host``) is the control that shows the probe
would see an open port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfdist.cluster.private_network import outside_addresses, why_not_private

from helpers import netns
from helpers.intruder import AS_NOBODY
from helpers.netns import wait_for
from helpers.project import REPO, local_mode_environment, tiny_params, train_stage_command

#: Connects to argv[1]:argv[2] and prints what happened: open, refused, or timeout.
_CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
    print("open")
except ConnectionRefusedError:
    print("refused")
except OSError as err:
    print(type(err).__name__)
"""


def test_what_a_cluster_reaches_outside_is_read_from_its_uris():
    assert outside_addresses(["sqlite:///mlruns/mlflow.db", "", "file:///x",
                              "postgresql://me@/tfdist?host=/var/run/postgresql"]) == []
    assert outside_addresses(["http://127.0.0.1:5000", "https://localhost", "postgresql+psycopg://db:6000/x"]) == [
        ("127.0.0.1", 5000), ("localhost", 443), ("db", 6000)]
    assert "mlflow.example:80" in why_not_private([("127.0.0.1", 5000), ("mlflow.example", 80)])


def connect(prefix: list[str], host: str, port: int) -> str:
    result = subprocess.run([*prefix, sys.executable, "-c", _CONNECT, host, str(port)], capture_output=True,
                            text=True, timeout=30, cwd="/")
    return result.stdout.strip() or result.stderr.strip()


def task_ports(workdir: Path) -> list[tuple[int, int]]:
    """(pid, port) of each task of the stage running under ``workdir``, from its TF_CONFIG."""
    found = []
    for line in subprocess.run(["pgrep", "-f", "stages.train"], capture_output=True, text=True).stdout.split():
        try:
            environ = Path(f"/proc/{line}/environ").read_bytes().split(b"\0")
            command = Path(f"/proc/{line}/cmdline").read_bytes()
        except OSError:
            continue
        config = [e[len(b"TF_CONFIG="):] for e in environ if e.startswith(b"TF_CONFIG=")]
        if str(workdir).encode() in command and config and config[0]:
            spec = json.loads(config[0])
            address = spec["cluster"][spec["task"]["type"]][spec["task"]["index"]]
            found.append((int(line), int(address.rsplit(":", 1)[1])))
    return found


def start_training(hosts, host: int, workdir: Path, network: str) -> tuple[subprocess.Popen, Path]:
    tiny_params(workdir, train={"epochs": 40, "batch_size": 25}, distributed={"task_network": network})
    log = workdir / "stage.log"
    process = hosts.start(host, train_stage_command(workdir, "multi_worker_mirrored", "mw"), local_mode_environment(),
                          REPO, log)
    return process, log


@pytest.mark.slow
@pytest.mark.skipif(bool(netns.available()), reason=netns.available() or "ok")
def test_no_other_host_or_local_user_reaches_a_local_clusters_tasks(tmp_path, prepared_dir):
    import shutil

    private, exposed = tmp_path / "private", tmp_path / "exposed"
    for workdir in (private, exposed):
        shutil.copytree(prepared_dir, workdir / "data" / "prepared")
    with netns.TestHosts(2) as hosts:
        runs = [start_training(hosts, 0, private, "private"), start_training(hosts, 1, exposed, "host")]
        for process, log in runs:
            wait_for(log, "Epoch 2/", process, timeout=180)
        inside, outside = task_ports(private), task_ports(exposed)
        assert len(inside) == 2 and len(outside) == 2, (inside, outside)
        pid, port = inside[0]
        listening = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "ss", "-ltnH"], capture_output=True,
                                   text=True).stdout
        assert f":{port} " in listening, f"the task does not listen in its own network:\n{listening}"
        # the intruder: another host, then another local user of the machine
        assert connect(hosts.enter(1), hosts.addresses[0], port) == "refused"
        assert connect([*hosts.enter(0), *AS_NOBODY], "127.0.0.1", port) == "refused"
        assert connect(hosts.enter(0), hosts.addresses[0], port) == "refused"
        # the control: a cluster left on its host's network is open to the same probe
        assert connect(hosts.enter(0), hosts.addresses[1], outside[0][1]) == "open"
        for process, log in runs:
            assert process.wait(timeout=300) == 0, log.read_text()[-3000:]
        assert "in a private network" in (private / "stage.log").read_text()
        warned = [line for line in (exposed / "stage.log").read_text().splitlines() if "every interface" in line]
        assert len(warned) == 1 and str(outside[0][1]) in warned[0], warned
    assert json.loads((private / "reports" / "mw.json").read_text())


#: Run as another user by the system's Python: enters a private network (a user namespace first) and reaches an
#: HTTP server of the host's loopback through the relay.
_UNPRIVILEGED = """
import os, sys, urllib.request
from tfdist.cluster import private_network as net
if net.inside():
    net.settle_inside()
    body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/", timeout=10).read()
    print("inside", os.readlink("/proc/self/ns/net"), body.decode())
else:
    print("outside", os.readlink("/proc/self/ns/net"), " ".join(net.unshare_command() or ["none"]))
    net.run_inside([sys.executable, __file__, sys.argv[1]], [("127.0.0.1", int(sys.argv[1]))])
"""


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(), reason="needs root to act as nobody")
def test_an_unprivileged_user_gets_a_private_network_that_still_reaches_the_tracking_server():
    import http.server
    import shutil
    import tempfile
    import threading

    src = REPO / "src"
    if subprocess.run([*AS_NOBODY, "test", "-r", str(src / "tfdist" / "__init__.py")]).returncode:
        pytest.skip("this checkout is not readable by another user")
    if subprocess.run([*AS_NOBODY, "unshare", "--user", "--map-root-user", "--net", "true"]).returncode:
        pytest.skip("this kernel gives unprivileged users no namespaces (the launcher warns instead)")

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"store says hello")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    home = Path(tempfile.mkdtemp(prefix="tfdist-nobody-"))
    try:
        (home / "probe.py").write_text(_UNPRIVILEGED)
        shutil.chown(home, 65534, 65534)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(src), "HOME": str(home), "TMPDIR": str(home)}
        done = subprocess.run([*AS_NOBODY, "/usr/bin/python3", str(home / "probe.py"), str(server.server_port)],
                              env=env, capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        server.shutdown()
        shutil.rmtree(home, ignore_errors=True)
    lines = done.stdout.split("\n")
    outside, inside = lines[0].split(), lines[1].split(maxsplit=2)
    assert outside[2:] == ["unshare", "--user", "--map-root-user", "--net"], done.stdout + done.stderr
    assert inside[0] == "inside" and inside[1] != outside[1], "a network of its own"
    assert inside[2] == "store says hello", "the relay reached the host's loopback"
