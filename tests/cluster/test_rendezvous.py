"""A cluster task waits for its peers: bounded, saying who is missing, and interruptible (real sockets, real processes)."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tfdist.cluster import rendezvous
from tfdist.distribute.cluster_spec import ClusterTask
from tfdist.errors import RunError

from helpers.project import REPO, local_mode_environment, tiny_params, train_stage_command
from helpers.servers import free_ports


def cluster(count):
    return {"worker": [f"127.0.0.1:{port}" for port in free_ports(count)]}


def test_peers_are_every_other_task_but_evaluators():
    task = ClusterTask({"chief": ["a:1"], "worker": ["b:2", "c:3"], "ps": ["d:4"], "evaluator": ["e:5"]}, "worker", 1)
    assert rendezvous.peers(task) == {"chief-0": "a:1", "worker-0": "b:2", "ps-0": "d:4"}


def test_a_task_returns_as_soon_as_its_peer_listens(monkeypatch):
    spec = cluster(2)
    peer = socket.socket()
    peer.bind(("127.0.0.1", int(spec["worker"][1].rsplit(":", 1)[1])))
    peer.listen(8)
    try:
        assert rendezvous.wait_for_peers(ClusterTask(spec, "worker", 0), timeout=10) < 2
    finally:
        peer.close()


def test_two_tasks_waiting_for_each_other_both_get_through():
    """Each listens on its own address while it waits: neither waits for the other forever."""
    spec = cluster(2)
    # After the wait, each serves its port for a while, as TensorFlow's server then does.
    code = ("import sys, json, socket, time; from tfdist.cluster import rendezvous\n"
            "from tfdist.distribute.cluster_spec import ClusterTask\n"
            "task = ClusterTask(json.loads(sys.argv[1]), 'worker', int(sys.argv[2]))\n"
            "print(rendezvous.wait_for_peers(task, 30), flush=True)\n"
            "server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "server.bind(('127.0.0.1', int(task.cluster['worker'][task.task_index].rsplit(':', 1)[1])))\n"
            "server.listen(64); time.sleep(4)")
    first = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec), "0"], stdout=subprocess.PIPE, text=True)
    time.sleep(2)  # the second starts late
    second = subprocess.run([sys.executable, "-c", code, json.dumps(spec), "1"], capture_output=True, text=True,
                            timeout=60)
    assert second.returncode == 0, second.stderr
    assert first.wait(timeout=60) == 0 and float(first.stdout.read()) >= 1.5


def test_a_missing_peer_is_named_every_few_seconds_then_given_up_on(monkeypatch, caplog):
    monkeypatch.setattr(rendezvous, "REPORT_INTERVAL", 0.5)
    spec = cluster(3)
    caplog.set_level(logging.INFO, logger="tfdist.cluster.rendezvous")
    started = time.monotonic()
    with pytest.raises(RunError) as error:
        rendezvous.wait_for_peers(ClusterTask(spec, "worker", 0), timeout=2)
    assert 2 <= time.monotonic() - started < 5
    assert str(error.value).startswith(
        f"worker-0 gave up after 2 s waiting for worker-1 ({spec['worker'][1]}), worker-2 ({spec['worker'][2]}): "
        "not started, or unreachable from here")
    assert f"worker-0: waiting for worker-1 at {spec['worker'][1]}" in caplog.text


@pytest.mark.slow
def test_a_worker_whose_peer_never_starts_exits_1_naming_it(tmp_path, prepared_copy):
    tiny_params(tmp_path, distributed={"connect_timeout": 6})
    spec = cluster(2)
    env = {**local_mode_environment(), "TF_CONFIG": json.dumps({"cluster": spec, "task": {"type": "worker", "index": 0}})}
    started = time.monotonic()
    result = subprocess.run(train_stage_command(tmp_path, "multi_worker_mirrored"), cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and time.monotonic() - started < 60
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"error: worker-0 gave up after 6 s waiting for worker-1 ({spec['worker'][1]})")
    assert "Traceback" not in result.stderr and f"waiting for worker-1 at {spec['worker'][1]}" in result.stderr


@pytest.mark.slow
def test_sigterm_stops_a_worker_waiting_for_its_peer_within_seconds(tmp_path, prepared_copy):
    tiny_params(tmp_path, distributed={"connect_timeout": 300})
    spec = cluster(2)
    env = {**local_mode_environment(), "TF_CONFIG": json.dumps({"cluster": spec, "task": {"type": "worker", "index": 0}})}
    process = subprocess.Popen(train_stage_command(tmp_path, "multi_worker_mirrored"), cwd=REPO, env=env,
                               stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        if "waiting for worker-1" in line:
            break
    os.kill(process.pid, signal.SIGTERM)
    stopped = time.monotonic()
    assert process.wait(timeout=20) == 128 + signal.SIGTERM
    assert time.monotonic() - stopped < 5
    assert "error: interrupted by SIGTERM" in process.stderr.read()
