"""Slurm as an engine: the train stage reads its task from a Slurm step (TensorFlow's SlurmClusterResolver).

The fast tests give the resolver the variables Slurm sets in each task; the
slow ones run a real single-node Slurm (tests/slurm.py) and the project's
sbatch example on it.
"""

import json
import subprocess
import sys

import pytest

from tfdist.cluster.slurm import in_slurm_step, read_slurm
from tfdist.config import load_config
from tfdist.distribute.cluster_spec import ClusterError
from tfdist.distribute.registry import get_spec

from helpers import slurm
from helpers.project import REPO, local_mode_environment, tiny_params, train_stage_command

STEP = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}


@pytest.fixture
def slurm_task(monkeypatch):
    def set_rank(rank, **step):
        for name, value in {**STEP, **step, "SLURM_PROCID": str(rank)}.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi: a CPU node
    return set_rank


def test_a_step_of_several_tasks_is_a_cluster_and_one_task_is_not(slurm_task):
    assert not in_slurm_step({})
    assert not in_slurm_step({"SLURM_PROCID": "0", **STEP, "SLURM_STEP_NUM_TASKS": "1"})
    assert in_slurm_step({"SLURM_PROCID": "3", **STEP})


def test_every_task_of_a_multi_worker_mirrored_step_is_a_worker_on_its_node(tmp_path, slurm_task):
    slurm_task(3)
    task = read_slurm(get_spec("multi_worker_mirrored"), load_config(tiny_params(tmp_path)).distributed)
    assert task.cluster == {"worker": ["node1:8888", "node1:8889", "node2:8888", "node2:8889"]}
    assert (task.task_type, task.task_index) == ("worker", 3)


def test_a_parameter_server_step_has_a_chief_the_configured_ps_and_the_rest_workers(tmp_path, slurm_task):
    slurm_task(2)
    task = read_slurm(get_spec("parameter_server"), load_config(tiny_params(tmp_path)).distributed)
    assert task.cluster == {"chief": ["node1:8888"], "ps": ["node1:8889"], "worker": ["node2:8888", "node2:8889"]}
    assert task.name == "worker-0"


def test_a_step_too_small_for_parameter_server_is_refused_naming_the_srun_to_use(tmp_path, slurm_task):
    slurm_task(0, SLURM_STEP_NUM_TASKS="2", SLURM_STEP_TASKS_PER_NODE="1(x2)")
    with pytest.raises(ClusterError, match=r"Slurm step of 2 tasks is too small for parameter_server: .* run srun -n 3"):
        read_slurm(get_spec("parameter_server"), load_config(tiny_params(tmp_path)).distributed)


@pytest.fixture(scope="module")
def private_slurm(tmp_path_factory):
    reason = slurm.available()
    if reason:
        pytest.skip(reason)
    cluster = slurm.PrivateSlurm(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    yield cluster
    cluster.stop()


def reports_agree(workdir, name, out):
    report = json.loads((workdir / "reports" / f"{name}.json").read_text())
    assert report["workers"] == 2 and report["replicas"] == 2
    assert f"worker-1: final weights sha256 {report['weights_sha256']}" in out
    return report


@pytest.mark.slow
def test_srun_of_two_tasks_trains_multi_worker_mirrored_as_a_cluster(tmp_path, prepared_copy, private_slurm):
    tiny_params(tmp_path)
    env = {**local_mode_environment(), "SLURM_CONF": private_slurm.env["SLURM_CONF"]}
    result = subprocess.run(["srun", "-n", "2", "--kill-on-bad-exit=1", *train_stage_command(tmp_path, "multi_worker_mirrored")],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Slurm step: task 0 of 2 is worker-0" in result.stderr and "Slurm step: task 1 of 2 is worker-1" in result.stderr
    assert "local mode" not in result.stderr, "a Slurm task must not start its own cluster"
    report = reports_agree(tmp_path, "multi_worker_mirrored", result.stderr)
    assert report["hardware"]["hosts"] == [private_slurm.node]


@pytest.mark.slow
def test_the_sbatch_example_trains_on_the_allocation(tmp_path, prepared_copy, private_slurm):
    tiny_params(tmp_path)
    paths = ["--params", str(tmp_path / "params.yaml"), "--data", str(tmp_path / "data" / "prepared"),
             "--models", str(tmp_path / "models"), "--reports", str(tmp_path / "reports"),
             "--backups", str(tmp_path / "backups")]
    log = tmp_path / "job.log"
    env = {**local_mode_environment(), "SLURM_CONF": private_slurm.env["SLURM_CONF"], "PYTHON": sys.executable}
    job = subprocess.run(["sbatch", "--parsable", "--nodes=1", f"--output={log}", "--chdir", str(REPO),
                          str(REPO / "examples" / "slurm" / "train-multi-worker-mirrored.sbatch"), *paths],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    state = private_slurm.wait_for_job(job, timeout=300)  # sbatch --wait polls only every 30 s or so
    assert state == {"JobState": "COMPLETED", "ExitCode": "0:0"}, log.read_text()[-3000:]
    reports_agree(tmp_path, "multi_worker_mirrored", log.read_text())
