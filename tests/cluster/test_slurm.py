"""Slurm as an engine: the train stage reads its task from a Slurm step (TensorFlow's SlurmClusterResolver).

These give the resolver the variables Slurm sets in each task; a real Slurm
cluster across test hosts runs the stage and the project's sbatch example in
tests/cluster/test_slurm_hosts.py.
"""


import pytest

from tfdist.cluster.slurm import in_slurm_step, read_slurm
from tfdist.config.params import load_config
from tfdist.distribute.cluster_spec import ClusterError
from tfdist.distribute.registry import get_spec

from helpers.project import tiny_params

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
