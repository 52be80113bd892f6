"""Ray Train across machines: a Ray head on one test host, a second node joining from another, a task on each.

The hosts are network namespaces with addresses of their own on one switch
(tests/helpers/netns.py). Each Ray node is started as a user starts one on a
machine of a cluster (``ray start --head`` on the first, ``ray start
--address`` on the second, each with its host's address and one CPU;
tests/helpers/ray_nodes.py), and the train stage runs on the head's host,
joining it. One cluster for the module.
"""

import json
import os
import re
import signal
import subprocess
import time

import pytest

from helpers import netns, ray_nodes
from helpers.project import REPO, local_mode_environment, tiny_params, train_stage_command

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(netns.available()), reason=netns.available() or "")]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """Two hosts, a Ray node on each: (hosts, head address)."""
    with netns.TestHosts(2) as hosts, ray_nodes.RayNodes(hosts, tmp_path_factory.mktemp("ray-hosts")) as nodes:
        yield hosts, nodes.address


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
    process = hosts.start(0, command, {**local_mode_environment(), **ray_nodes.TOKEN}, REPO, tmp_path / "driver.log")
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
    tiny_params(tmp_path, distributed={"launcher": "ray", "ray_address": f"{hosts.addresses[0]}:{ray_nodes.PORT + 1}"})
    started = time.monotonic()
    process = hosts.start(1, train_stage_command(tmp_path, "multi_worker_mirrored"),
                          {**local_mode_environment(), **ray_nodes.TOKEN}, REPO, tmp_path / "driver.log")
    code = process.wait(timeout=120)
    output = (tmp_path / "driver.log").read_text()
    assert code == 1 and time.monotonic() - started < 60, output[-3000:]
    assert output.strip().splitlines()[-1] == (
        f"error: the Ray cluster at {hosts.addresses[0]}:{ray_nodes.PORT + 1} does not answer (Connection refused): start it "
        "(ray start --head) or fix distributed.ray_address; local starts one here")
