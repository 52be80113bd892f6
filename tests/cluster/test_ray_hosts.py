"""Ray Train across machines: a Ray head on one test host, a second node joining from another, a task on each.

The hosts are network namespaces with addresses of their own on one switch
(tests/helpers/netns.py). Each Ray node is started as a user starts one on a
machine of a cluster (``ray start --head`` on the first, ``ray start
--address`` on the second, each with its host's address and one CPU), and the
train stage runs on the head's host, joining it. One cluster for the module.
"""

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import netns
from helpers.project import REPO, local_mode_environment, tiny_params, train_stage_command

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(netns.available()), reason=netns.available() or "")]

RAY = str(Path(sys.executable).parent / "ray")
PORT = 6379
#: Seconds a Ray node may take to start on a loaded 2-core machine (about 10 s measured).
NODE_START_TIMEOUT = 90


def ray_node(hosts: netns.TestHosts, host: int, root: Path) -> subprocess.Popen:
    """``ray start --block`` on host ``host``: the head on host 0, a node joining it on the others."""
    role = ["--head", f"--port={PORT}", "--include-dashboard=false"] if host == 0 else [
        f"--address={hosts.addresses[0]}:{PORT}"]
    # A short folder of its own: Ray's sockets live under it, and a socket's path has at most 107 bytes
    # (pytest's temp folders under xdist are longer than that leaves room for).
    temp = tempfile.mkdtemp(prefix=f"tfdist-ray-{host}-", dir="/tmp")
    command = [RAY, "start", "--block", *role, f"--node-ip-address={hosts.addresses[host]}", "--num-cpus=1",
               "--disable-usage-stats", f"--temp-dir={temp}"]
    env = {**os.environ, **TOKEN, "RAY_AUTH_MODE": "token", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "2"}
    env.pop(_LOOPBACK_ONLY, None)
    node = hosts.start(host, command, env, REPO, root / f"ray-node-{host}.log")
    node.temp_dir = temp  # removed with the cluster
    return node


_LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: The cluster's authentication token, given to every node and to the stage as a user gives it to each machine
#: (``ray start`` turns token authentication on; ~/.ray/auth_token would be shared with other tests' clusters).
TOKEN = {"RAY_AUTH_TOKEN": secrets.token_hex(32)}


def wait_for_nodes(hosts: netns.TestHosts, count: int, root: Path, nodes: list[subprocess.Popen]) -> None:
    """Until the head's cluster counts ``count`` live nodes (``ray status`` on the head's host), bounded."""
    deadline = time.monotonic() + NODE_START_TIMEOUT
    while True:
        for i, node in enumerate(nodes):
            assert node.poll() is None, (root / f"ray-node-{i}.log").read_text()[-3000:]
        status = subprocess.run(["ip", "netns", "exec", hosts.names[0], RAY, "status",
                                 f"--address={hosts.addresses[0]}:{PORT}"], capture_output=True, text=True, timeout=60,
                                env={**os.environ, **TOKEN, "RAY_AUTH_MODE": "token"})
        if status.returncode == 0 and len(re.findall(r"^\s*1 node_", status.stdout, re.M)) >= count:
            return
        assert time.monotonic() < deadline, f"{count} Ray nodes never came up:\n{status.stdout}{status.stderr}"
        time.sleep(2)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """Two hosts, a Ray node on each: (hosts, head address)."""
    root = tmp_path_factory.mktemp("ray-hosts")
    with netns.TestHosts(2) as hosts:
        nodes = [ray_node(hosts, 0, root)]
        deadline = time.monotonic() + NODE_START_TIMEOUT
        while subprocess.run(["ip", "netns", "exec", hosts.names[0], sys.executable, "-c",
                              f"import socket; socket.create_connection(('{hosts.addresses[0]}', {PORT}), 1)"],
                             capture_output=True).returncode:
            assert nodes[0].poll() is None and time.monotonic() < deadline, (root / "ray-node-0.log").read_text()[-3000:]
            time.sleep(0.5)
        nodes.append(ray_node(hosts, 1, root))
        try:
            wait_for_nodes(hosts, 2, root, nodes)
            yield hosts, f"{hosts.addresses[0]}:{PORT}"
        finally:
            for node in nodes:  # ray start --block stops what it started
                if node.poll() is None:
                    node.send_signal(signal.SIGTERM)
            for node in nodes:
                try:
                    node.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(node.pid, signal.SIGKILL)
                shutil.rmtree(node.temp_dir, ignore_errors=True)


def report(workdir, name):
    return json.loads((workdir / "reports" / f"{name}.json").read_text())


def test_ray_places_a_worker_on_each_machine_and_trains_the_local_launcher_s_weights(tmp_path, prepared_copy,
                                                                                      ray_cluster):
    hosts, address = ray_cluster
    tiny_params(tmp_path, train={"epochs": 2, "batch_size": 25})
    local = subprocess.run(train_stage_command(tmp_path, "multi_worker_mirrored", "local"), cwd=REPO,
                           env=local_mode_environment(), capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr[-3000:]
    command = train_stage_command(tmp_path, "multi_worker_mirrored", "ray", "distributed.launcher=ray",
                                  f"distributed.ray_address={address}")
    process = hosts.start(0, command, {**local_mode_environment(), **TOKEN}, REPO, tmp_path / "driver.log")
    try:
        code = process.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    output = (tmp_path / "driver.log").read_text()
    assert code == 0, output[-3000:]
    placed = dict(re.findall(r"started (worker-\d) \(pid \d+\) in Ray worker \d+ on node ([\d.]+)", output))
    # Ray ranks the workers as it likes; what matters is one on each machine
    assert sorted(placed) == ["worker-0", "worker-1"] and sorted(placed.values()) == hosts.addresses, output[-3000:]
    assert f"on the Ray cluster at {address}" in output
    assert report(tmp_path, "ray")["weights_sha256"] == report(tmp_path, "local")["weights_sha256"]
    assert sorted(report(tmp_path, "ray")["hardware"]["hosts"]) == hosts.addresses
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["local", "ray"], "the chief alone wrote outputs"


def test_a_head_that_does_not_answer_from_another_machine_fails_in_seconds_naming_it(tmp_path, prepared_copy,
                                                                                    ray_cluster):
    hosts, address = ray_cluster
    tiny_params(tmp_path, distributed={"launcher": "ray", "ray_address": f"{hosts.addresses[0]}:{PORT + 1}"})
    started = time.monotonic()
    process = hosts.start(1, train_stage_command(tmp_path, "multi_worker_mirrored"),
                          {**local_mode_environment(), **TOKEN}, REPO, tmp_path / "driver.log")
    code = process.wait(timeout=120)
    output = (tmp_path / "driver.log").read_text()
    assert code == 1 and time.monotonic() - started < 60, output[-3000:]
    assert output.strip().splitlines()[-1] == (
        f"error: the Ray cluster at {hosts.addresses[0]}:{PORT + 1} does not answer (Connection refused): start it "
        "(ray start --head) or fix distributed.ray_address; local starts one here")
