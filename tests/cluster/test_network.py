"""Clusters across a real network: each task on its own test host (tests/netns.py), and the faults a network has.

Every task runs the train stage in cluster mode (TF_CONFIG names the hosts'
addresses, no launcher), as on several machines. The faults are real: a
cable unplugged at the switch, a task killed with SIGKILL or stopped with
SIGTERM, a host that never comes up. Each test asserts what the user reads
(one line naming the lost task and its address, no traceback), the exit
code, how soon, and how the chief's MLflow run ended.
"""

import json
import os
import re
import signal
import time
from pathlib import Path

import mlflow
import pytest

from tfdist.errors import PREEMPTED_EXIT
from tfdist.tracking.runs import PREEMPTED_TAG

from helpers import netns
from helpers.netns import wait_for
from helpers.project import REPO, local_mode_environment, tiny_params, train_stage_command

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(netns.available()), reason=netns.available() or "ok")]
PORT = 2222


@pytest.fixture
def workdir(tmp_path, prepared_copy):
    return tmp_path


def start(hosts, host, cluster, job, index, workdir, strategy):
    env = {**local_mode_environment(), "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})}
    log = workdir / f"{job}-{index}.log"
    return hosts.start(host, train_stage_command(workdir, strategy), env, REPO, log), log


def last_line(log: Path) -> str:
    return log.read_text().strip().splitlines()[-1]


def training_run(workdir):
    mlflow.set_tracking_uri(f"sqlite:///{workdir}/mlruns/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["tests"], output_format="list")
    (run,) = [run for run in runs if run.data.tags.get("tfdist.role") != "execution"]
    return run


def mirrored_pair(hosts, workdir, **distributed):
    tiny_params(workdir, train={"epochs": distributed.pop("epochs", 60), "batch_size": 25}, distributed=distributed)
    cluster = {"worker": [f"{address}:{PORT}" for address in hosts.addresses]}
    return [start(hosts, i, cluster, "worker", i, workdir, "multi_worker_mirrored") for i in range(2)], cluster


def mirrored_pair_training(hosts, workdir, **distributed):
    """A 60-epoch multi_worker_mirrored pair, once its chief has reached epoch 3: time for a fault."""
    tasks, cluster = mirrored_pair(hosts, workdir, **distributed)
    wait_for(tasks[0][1], "Epoch 3/")
    return tasks, cluster


def parameter_server_cluster(hosts, workdir, epochs):
    tiny_params(workdir, train={"epochs": epochs, "batch_size": 25})
    a = [f"{address}:{PORT}" for address in hosts.addresses]
    cluster = {"chief": [a[0]], "worker": [a[1], a[2]], "ps": [a[3]]}
    order = [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    return [start(hosts, i, cluster, job, index, workdir, "parameter_server") for i, (job, index) in enumerate(order)]


def test_multi_worker_mirrored_trains_across_two_hosts_to_identical_weights(workdir):
    with netns.TestHosts(2) as hosts:
        tasks, cluster = mirrored_pair(hosts, workdir, epochs=2)
        for process, log in tasks:
            assert process.wait(timeout=240) == 0, log.read_text()[-3000:]
    report = json.loads((workdir / "reports" / "multi_worker_mirrored.json").read_text())
    assert report["hardware"]["hosts"] == hosts.addresses and report["workers"] == 2
    assert f"final weights sha256 {report['weights_sha256']}" in (workdir / "worker-1.log").read_text()
    assert training_run(workdir).info.status == "FINISHED"


def test_parameter_server_trains_with_each_task_on_its_own_host(workdir):
    with netns.TestHosts(4) as hosts:
        (chief, log), *servers = parameter_server_cluster(hosts, workdir, epochs=2)
        assert chief.wait(timeout=240) == 0, log.read_text()[-3000:]
        assert all(server.poll() is None for server, _ in servers), "workers and ps serve until stopped"
    report = json.loads((workdir / "reports" / "parameter_server.json").read_text())
    assert report["workers"] == 2 and report["ps"] == 1
    assert report["hardware"]["hosts"] == hosts.addresses
    assert training_run(workdir).info.status == "FINISHED"


def test_a_cut_cable_ends_both_workers_within_the_heartbeat_timeout_each_naming_what_it_lost(workdir):
    with netns.TestHosts(2) as hosts:
        tasks, cluster = mirrored_pair_training(hosts, workdir, heartbeat_timeout=4)
        hosts.cut(1)
        cut = time.monotonic()
        codes = [process.wait(timeout=60) for process, _ in tasks]
        detected = time.monotonic() - cut
    assert codes == [1, 1] and detected < 8, f"{detected:.1f} s: TensorFlow's own 10 s heartbeat, not ours?"
    (_, chief_log), (_, other_log) = tasks
    assert last_line(chief_log).startswith(
        f"error: worker-0 lost worker-1 ({cluster['worker'][1]}) during training: no heartbeat for 4 s")
    assert last_line(other_log).startswith(
        f"error: worker-1 lost the cluster's coordination service on worker-0 ({cluster['worker'][0]})")
    for _, log in tasks:
        assert "Traceback" not in log.read_text() and "StartAbort" not in log.read_text()
    assert training_run(workdir).info.status == "FAILED"


def test_a_killed_worker_ends_its_peer_naming_it(workdir):
    with netns.TestHosts(2) as hosts:
        tasks, cluster = mirrored_pair_training(hosts, workdir)
        os.killpg(tasks[1][0].pid, signal.SIGKILL)
        killed = time.monotonic()
        assert tasks[0][0].wait(timeout=60) == 1
        detected = time.monotonic() - killed
    assert detected < 10 + 10
    assert last_line(tasks[0][1]).startswith(f"error: worker-0 lost worker-1 ({cluster['worker'][1]}) during training")
    assert "Traceback" not in tasks[0][1].read_text()
    assert training_run(workdir).info.status == "FAILED"


def test_sigterm_to_the_chief_alone_backs_both_workers_up_at_one_step_and_ends_its_run_preempted(workdir):
    with netns.TestHosts(2) as hosts:
        tasks, cluster = mirrored_pair_training(hosts, workdir)
        os.kill(tasks[0][0].pid, signal.SIGTERM)  # one machine's notice (a pod evicted): its peer hears of it
        stopped = time.monotonic()
        assert tasks[0][0].wait(timeout=30) == PREEMPTED_EXIT
        assert time.monotonic() - stopped < 20
        assert tasks[1][0].wait(timeout=30) == PREEMPTED_EXIT
    where = re.match(r"error: preempted \(SIGTERM\): (backed up at epoch \d+, step \d+); run the same", last_line(tasks[0][1]))
    assert where, last_line(tasks[0][1])
    assert last_line(tasks[1][1]).startswith(f"error: preempted (SIGTERM): {where[1]};"), "the same step, agreed"
    run = training_run(workdir)
    assert run.info.status == "KILLED" and run.data.tags[PREEMPTED_TAG] == where[1]


def test_a_killed_ps_ends_the_chief_at_once_naming_it(workdir):
    with netns.TestHosts(4) as hosts:
        (chief, log), *_, (ps, _) = parameter_server_cluster(hosts, workdir, epochs=60)
        wait_for(log, "Epoch 3/")
        os.killpg(ps.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert chief.wait(timeout=60) == 1
        assert time.monotonic() - killed < 15
    assert last_line(log).startswith(f"error: chief-0 lost ps-0 ({hosts.addresses[3]}:{PORT}) during training")
    assert "Traceback" not in log.read_text() and "Failed to remove function remotely" not in log.read_text()
    assert training_run(workdir).info.status == "FAILED"


def test_a_worker_whose_peer_s_host_never_comes_up_gives_up_naming_it(workdir):
    with netns.TestHosts(1) as hosts:
        tiny_params(workdir, distributed={"connect_timeout": 5})
        cluster = {"worker": [f"{hosts.addresses[0]}:{PORT}", f"{netns.SUBNET}.99:{PORT}"]}  # no host has .99
        (process, log), = [start(hosts, 0, cluster, "worker", 0, workdir, "multi_worker_mirrored")]
        started = time.monotonic()
        assert process.wait(timeout=120) == 1
        assert time.monotonic() - started < 5 + 30
    assert last_line(log).startswith(f"error: worker-0 gave up after 5 s waiting for worker-1 ({netns.SUBNET}.99:{PORT})")
    assert "Traceback" not in log.read_text()
