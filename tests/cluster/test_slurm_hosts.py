"""Slurm across machines: slurmctld on one test host, a slurmd on each of two, a task on each node.

The hosts are network namespaces with addresses and names of their own on one
switch (tests/helpers/netns.py); each node is named after its host and reached
at its address, as on a cluster (tests/helpers/slurm.py). The client commands
run on host 0, as on a login node. One cluster for the module.
"""

import json
import re
import subprocess
import sys
import time

import mlflow
import pytest

from helpers import netns, slurm
from helpers.project import REPO, local_mode_environment, running_stage_tasks, stage_paths, tiny_params, train_stage_command

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(netns.available() or slurm.available()),
                                                   reason=netns.available() or slurm.available() or "")]

#: Seconds a 2-epoch run of the tiny params may take across the hosts on a loaded machine (about 40 s measured).
RUN_TIMEOUT = 300


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with netns.TestHosts(2) as hosts:
        private = slurm.PrivateSlurm(tmp_path_factory.mktemp("slurm-hosts"), hosts)
        try:
            private.start()
            yield private
        finally:
            private.stop()


def environment(cluster) -> dict[str, str]:
    return {**local_mode_environment(), "SLURM_CONF": cluster.env["SLURM_CONF"], "PYTHON": sys.executable}


def parameter_server_step(cluster, workdir) -> subprocess.CompletedProcess:
    """parameter_server under ``srun -N2 -n3``: the chief and the ps on one node, a worker on the other."""
    return subprocess.run(cluster.client(["srun", "-N2", "-n3", "--kill-on-bad-exit=1",
                                          *train_stage_command(workdir, "parameter_server")]),
                          cwd=REPO, env=environment(cluster), capture_output=True, text=True, timeout=RUN_TIMEOUT)


def test_the_sbatch_example_puts_a_worker_on_each_node_and_a_preempted_job_requeues_and_goes_on(
        tmp_path, prepared_copy, cluster):
    # the convnet's epochs last seconds: a SIGTERM lands within epoch 1, and the requeued job trains the rest
    tiny_params(tmp_path, model={"kind": "cnn"}, train={"batch_size": 8, "steps_per_execution": 10, "backup_every": 0})
    log = tmp_path / "job.log"
    job = subprocess.run(cluster.client(["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", f"--output={log}",
                                         "--chdir", str(REPO),
                                         str(REPO / "examples" / "slurm" / "train-multi-worker-mirrored.sbatch"),
                                         *stage_paths(tmp_path)]),
                         cwd=REPO, env=environment(cluster), capture_output=True, text=True, timeout=60,
                         check=True).stdout.strip()
    deadline = time.monotonic() + RUN_TIMEOUT
    while "Epoch 1/2" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no job log"
        time.sleep(0.2)
    # what Slurm does at --signal's time or a preemption's: SIGTERM to every task of the job's steps
    subprocess.run(cluster.client(["scancel", "--signal=TERM", job]), env=environment(cluster), check=True, timeout=30)
    state = cluster.wait_for_job(job, timeout=RUN_TIMEOUT)
    out = log.read_text()
    assert state == {"JobState": "COMPLETED", "ExitCode": "0:0", "Restarts": "1"}, out[-3000:]
    where = re.search(r"preempted \(SIGTERM\): backed up at epoch 1, step (\d+)", out)
    assert where and f"preempted: requeueing job {job}" in out, out[-3000:]
    assert f"resuming within epoch 1: its steps 1-{where[1]} are done" in out, out[-3000:]
    assert "Slurm step: task 0 of 2 is worker-0" in out and "Slurm step: task 1 of 2 is worker-1" in out
    report = json.loads((tmp_path / "reports" / "multi_worker_mirrored.json").read_text())
    assert report["workers"] == 2
    assert sorted(report["hardware"]["hosts"]) == sorted(cluster.nodes), "one worker on each node"
    assert f"worker-1: final weights sha256 {report['weights_sha256']}" in out
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    (run,) = [run for run in mlflow.search_runs(experiment_names=["tests"], output_format="list")
              if run.data.tags.get("tfdist.role") != "execution"]
    assert run.info.status == "FINISHED"
    epochs = mlflow.MlflowClient().get_metric_history(run.info.run_id, "val_accuracy")
    assert sorted(metric.step for metric in epochs) == [1, 2], "every epoch once, in the one run"


def test_parameter_server_across_nodes_ends_with_its_chief_and_leaves_no_task(tmp_path, prepared_copy, cluster):
    tiny_params(tmp_path, distributed={"ps": 1})
    started = time.monotonic()
    result = parameter_server_step(cluster, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Slurm step: task 0 of 3 is chief-0" in result.stderr
    assert "the chief is done and stopped its servers" in result.stderr
    report = json.loads((tmp_path / "reports" / "parameter_server.json").read_text())
    assert report["val_accuracy"] > 0.5
    assert sorted(report["hardware"]["hosts"]) == sorted(cluster.nodes)
    assert not running_stage_tasks(tmp_path), "every task of the step ended with it"
    print(f"parameter_server step across 2 nodes: {time.monotonic() - started:.0f} s")


def test_a_failing_chief_ends_the_step_with_its_exit_code(tmp_path, prepared_copy, cluster):
    tiny_params(tmp_path, distributed={"ps": 1})
    (tmp_path / "data" / "prepared" / "train-00003-of-00016.tfrecord").write_bytes(b"not a shard")
    result = parameter_server_step(cluster, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "train-00003-of-00016.tfrecord has 11 bytes" in result.stderr
    assert not running_stage_tasks(tmp_path)


def test_a_node_lost_mid_training_ends_the_step_naming_it_and_a_rerun_resumes(tmp_path, prepared_copy, cluster):
    tiny_params(tmp_path, train={"epochs": 6, "batch_size": 25})
    command = cluster.client(["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                              *train_stage_command(tmp_path, "multi_worker_mirrored")])
    step = subprocess.Popen(command, cwd=REPO, env=environment(cluster), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        for line in step.stdout:
            lines.append(line)
            if "Epoch 3/" in line:  # training, past its first backups
                break
        # The second machine fails: its network goes silent, and slurmd, slurmstepd and the task die at once.
        cluster.hosts.fail(1)
        failed = time.monotonic()
        rest, _ = step.communicate(timeout=180)
        ended = time.monotonic() - failed
    finally:
        if step.poll() is None:
            step.kill()
        cluster.hosts.mend(1)
        cluster.start_slurmd(1)
    out = "".join(lines) + rest
    print(f"step ended {ended:.1f} s after node {cluster.nodes[1]} failed, exit {step.returncode}:")
    print("\n".join(line for line in out.splitlines() if cluster.nodes[1] in line))
    assert step.returncode == 1, out[-3000:]
    assert f"error: worker-0 lost worker-1 ({cluster.nodes[1]}:" in out, out[-3000:]
    assert ended < 120, f"the step took {ended:.0f} s to end after its node failed"

    cluster.wait_until_idle()  # the node is back: the same srun again resumes into the same run
    again = subprocess.run(command, cwd=REPO, env=environment(cluster), capture_output=True, text=True,
                           timeout=RUN_TIMEOUT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from the backup" in again.stderr and "continuing at epoch" in again.stderr
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    (run,) = [run for run in mlflow.search_runs(experiment_names=["tests"], output_format="list")
              if run.data.tags.get("tfdist.role") != "execution"]
    assert run.info.status == "FINISHED"
    epochs = mlflow.MlflowClient().get_metric_history(run.info.run_id, "val_accuracy")
    assert sorted(metric.step for metric in epochs) == list(range(1, 7)), "every epoch once, in the one run"
