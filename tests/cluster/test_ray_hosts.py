"""Ray across machines: a Ray head on one test host, a second node joining from another, tasks on each.

The hosts are network namespaces with addresses of their own on one switch
(tests/helpers/netns.py). Each Ray node is started as a user starts one on a
machine of a cluster (``ray start --head`` on the first, ``ray start
--address`` on the second, each with its host's address, two CPUs on the head
and one on the other;
tests/helpers/ray_nodes.py), and the train stage runs on the head's host,
joining it. One cluster for the module; a test that kills a node brings it
back before it ends.
"""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import mlflow
import pytest

from helpers import netns, ray_nodes
from helpers.netns import wait_for
from helpers.project import LAUNCHER_TRAIN, REPO, local_mode_environment, running_stage_tasks, tiny_params, train_stage_command

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(netns.available()), reason=netns.available() or "")]

#: Seconds a stage on the cluster may take (about 20 s measured for 2 epochs; 8 epochs with a restart about 60 s).
RUN_TIMEOUT = 300
#: Epochs of a run a node is lost in (at epoch 3): long enough that it is lost mid-training (3 workers: ~1.5 s an epoch).
EPOCHS = 8


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """Two hosts, a Ray node on each (2 CPUs on the head, 1 on the other: 3 tasks fill it): (hosts, nodes)."""
    with netns.TestHosts(2) as hosts, \
            ray_nodes.RayNodes(hosts, tmp_path_factory.mktemp("ray-hosts"), cpus=(2, 1)) as nodes:
        yield hosts, nodes


def report(workdir, name):
    return json.loads((workdir / "reports" / f"{name}.json").read_text())


def ray_params(tmp_path, nodes, train=None, **distributed):
    return tiny_params(tmp_path, train={**LAUNCHER_TRAIN, **(train or {})},
                       distributed={"launcher": "ray", "ray_address": nodes.address, **distributed})


def start_stage(hosts, tmp_path, strategy, name=None):
    """The train stage on the head's host, joining the cluster: (process, its log)."""
    log = tmp_path / f"driver-{strategy}.log"
    process = hosts.start(0, train_stage_command(tmp_path, strategy, name), {**local_mode_environment(), **ray_nodes.TOKEN},
                          REPO, log)
    return process, log


def finish(process, log: Path, timeout=RUN_TIMEOUT):
    """Its exit code and output, once it ends (killed past ``timeout``)."""
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    return code, log.read_text()


def placed(output):
    """Task name -> node address, from each actor's first line."""
    return dict(re.findall(r"started ((?:worker|chief|ps)-\d) \(pid \d+\) in Ray worker \d+ on node ([\d.]+)", output))


def test_ray_places_a_worker_on_each_machine_and_trains_the_local_launcher_s_weights(tmp_path, prepared_copy,
                                                                                      ray_cluster, local_launcher_run):
    hosts, nodes = ray_cluster
    ray_params(tmp_path, nodes)  # local_launcher_run's training, with Ray as the launcher
    code, output = finish(*start_stage(hosts, tmp_path, "multi_worker_mirrored", "ray"))
    assert code == 0, output[-3000:]
    # Ray ranks the workers as it likes; what matters is one on each machine
    where = placed(output)
    assert sorted(where) == ["worker-0", "worker-1"] and sorted(where.values()) == hosts.addresses, output[-3000:]
    assert f"on the Ray cluster at {nodes.address}" in output
    assert report(tmp_path, "ray")["weights_sha256"] == local_launcher_run["weights_sha256"]
    assert sorted(report(tmp_path, "ray")["hardware"]["hosts"]) == hosts.addresses
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["ray"], "the chief alone wrote outputs"


def test_parameter_server_runs_its_chief_workers_and_ps_across_the_machines(tmp_path, prepared_copy, ray_cluster):
    hosts, nodes = ray_cluster
    ray_params(tmp_path, nodes, workers=1, ps=1)
    code, output = finish(*start_stage(hosts, tmp_path, "parameter_server"))
    assert code == 0, output[-3000:]
    where = placed(output)
    assert sorted(where) == ["chief-0", "ps-0", "worker-0"], output[-3000:]
    assert sorted(set(where.values())) == hosts.addresses, "spread over both machines"
    assert sorted(report(tmp_path, "parameter_server")["hardware"]["hosts"]) == hosts.addresses
    assert "ray: parameter_server trained; the chief wrote the outputs" in output
    assert not running_stage_tasks(tmp_path), "the servers were stopped with the run"
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    assert mlflow.get_run(report(tmp_path, "parameter_server")["mlflow_run_id"]).info.status == "FINISHED"


def test_a_sigterm_to_the_stage_reaches_every_task_which_back_up_at_one_step_and_the_rerun_goes_on(
        tmp_path, prepared_copy, ray_cluster):
    hosts, nodes = ray_cluster
    epochs = 4  # ~1 s each: the notice lands in epoch 2, or at worst a boundary of epoch 3 (after an epoch's end)
    ray_params(tmp_path, nodes, train={"epochs": epochs, "backup_every": 0})
    process, log = start_stage(hosts, tmp_path, "multi_worker_mirrored")
    wait_for(log, "Epoch 2/", process, RUN_TIMEOUT)
    process.send_signal(signal.SIGTERM)  # a scheduler's notice to the driver: Ray's launcher passes it on
    code, output = finish(process, log, timeout=60)
    assert code == 75, output[-3000:]
    where = re.search(r"error: preempted \(SIGTERM\): backed up at epoch (\d), step (\d+); run the same", output)
    assert where, output[-3000:]
    assert output.count(f"backed up at epoch {where[1]}, step {where[2]}") >= 3, "both workers, then the driver"
    code, output = finish(*start_stage(hosts, tmp_path, "multi_worker_mirrored"))
    assert code == 0, output[-3000:]
    assert f"resuming within epoch {where[1]}: its steps 1-{where[2]} are done" in output, output[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    run = mlflow.get_run(report(tmp_path, "multi_worker_mirrored")["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    losses = mlflow.MlflowClient().get_metric_history(run.info.run_id, "loss")
    assert sorted(metric.step for metric in losses) == list(range(1, epochs + 1)), "every epoch once, in the one run"


def test_a_raylet_killed_mid_training_restarts_the_group_once_its_node_is_back_and_training_resumes(
        tmp_path, prepared_copy, ray_cluster):
    hosts, nodes = ray_cluster
    # 3 workers fill the cluster: the group can start again only once the node is back
    ray_params(tmp_path, nodes, train={"epochs": EPOCHS}, workers=3, max_restarts=1)
    process, log = start_stage(hosts, tmp_path, "multi_worker_mirrored")
    try:
        wait_for(log, "Epoch 3/", process, RUN_TIMEOUT)  # training, past its first backups
        nodes.kill_raylet(1)
        wait_for(log, "restarting every task", process, RUN_TIMEOUT)
    finally:
        nodes.restart(1)  # the node comes back (a new Ray node on the same machine)
    code, output = finish(process, log)
    assert code == 0, output[-3000:]
    first, again = output.split("restarting every task")
    assert len(placed(first)) == 3 and len(placed(again)) == 3, "the group started again"
    assert hosts.addresses[1] in placed(again).values(), "on the node back"
    assert "its node or raylet may be gone" in first or "lost worker" in first, first[-3000:]
    assert re.search(r"INFO tfdist.resume: resuming from the backup .*: epochs 1-\d are done", output), output[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    run = mlflow.get_run(report(tmp_path, "multi_worker_mirrored")["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    epochs = mlflow.MlflowClient().get_metric_history(run.info.run_id, "val_accuracy")
    assert sorted(metric.step for metric in epochs) == list(range(1, EPOCHS + 1)), "every epoch once, in the one run"


def test_a_node_that_never_comes_back_ends_the_stage_in_bounded_time_naming_it(tmp_path, prepared_copy, ray_cluster):
    hosts, nodes = ray_cluster
    ray_params(tmp_path, nodes, train={"epochs": EPOCHS}, workers=3, max_restarts=1, connect_timeout=20)
    process, log = start_stage(hosts, tmp_path, "multi_worker_mirrored")
    try:
        wait_for(log, "Epoch 3/", process, RUN_TIMEOUT)
        nodes.kill_raylet(1)
        lost = time.monotonic()
        code, output = finish(process, log, timeout=180)
        ended = time.monotonic() - lost
    finally:
        nodes.restart(1)
    print(f"the stage ended {ended:.1f} s after the raylet of {hosts.addresses[1]} was killed, exit {code}")
    assert code == 1, output[-3000:]
    assert output.strip().splitlines()[-1] == (
        "error: no room on the Ray cluster for 3 tasks of 1 CPU within 20 s (distributed.connect_timeout): "
        f"node {hosts.addresses[1]} left the cluster and did not come back")
    assert ended < 120, f"the stage took {ended:.0f} s to end after its node was lost"
    assert not running_stage_tasks(tmp_path)


def test_a_head_that_does_not_answer_from_another_machine_fails_in_seconds_naming_it(tmp_path, prepared_copy,
                                                                                    ray_cluster):
    hosts, nodes = ray_cluster
    tiny_params(tmp_path, distributed={"launcher": "ray", "ray_address": f"{hosts.addresses[0]}:{ray_nodes.PORT + 1}"})
    started = time.monotonic()
    process = hosts.start(1, train_stage_command(tmp_path, "multi_worker_mirrored"),
                          {**local_mode_environment(), **ray_nodes.TOKEN}, REPO, tmp_path / "driver.log")
    code = process.wait(timeout=120)
    output = (tmp_path / "driver.log").read_text()
    assert code == 2 and time.monotonic() - started < 60, output[-3000:]
    assert output.strip().splitlines()[-1] == (
        f"error: the Ray cluster at {hosts.addresses[0]}:{ray_nodes.PORT + 1} does not answer (Connection refused): start it "
        "(ray start --head) or fix distributed.ray_address; local starts one here")
