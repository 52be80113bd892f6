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
