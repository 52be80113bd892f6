"""TF_CONFIG parsed into a cluster task: Kubeflow's, a person's, and what is wrong with a malformed one."""

import json

import pytest

from tfdist.cluster.roles import check_cluster
from tfdist.distribute.cluster_spec import ClusterError, ClusterTask, parse_tf_config, read_tf_config, tasks_of
from tfdist.distribute.registry import get_spec

PS_CLUSTER = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]}


def tf_config(cluster, task_type, index, **extra):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}, **extra})


def test_a_kubeflow_tf_config_is_understood():
    task = parse_tf_config(tf_config(PS_CLUSTER, "worker", 1, environment="cloud"))
    assert (task.task_type, task.task_index, task.name) == ("worker", 1, "worker-1")
    assert task.count("worker") == 2 and task.count("ps") == 1
    assert not task.is_chief
    check_cluster(task, get_spec("parameter_server"))


@pytest.mark.parametrize(("cluster", "task_type", "index", "chief"), [
    ({"worker": ["a:1", "b:1"]}, "worker", 0, True),
    ({"worker": ["a:1", "b:1"]}, "worker", 1, False),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "chief", 0, True),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "worker", 0, False),
])
def test_the_chief_is_the_chief_task_else_worker_0(cluster, task_type, index, chief):
    assert ClusterTask(cluster, task_type, index).is_chief is chief


def test_unset_or_blank_tf_config_means_local_mode():
    assert read_tf_config({}) is None
    assert read_tf_config({"TF_CONFIG": "  "}) is None
    assert read_tf_config({"TF_CONFIG": tf_config({"worker": ["a:1"]}, "worker", 0)}).name == "worker-0"


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"task": {"type": "worker", "index": 0}}', "'cluster' must map job names"),
    (tf_config({"trainer": ["a:1"]}, "trainer", 0), "unknown job 'trainer'"),
    (tf_config({"worker": []}, "worker", 0), "cluster.worker must be a non-empty list"),
    (tf_config({"worker": ["no-port"]}, "worker", 0), "address 'no-port' must look like host:port"),
    (tf_config({"worker": ["a:99999"]}, "worker", 0), "address 'a:99999'"),
    (tf_config({"worker": ["a:1"]}, "ps", 0), "task.type 'ps' is not a job of the cluster"),
    (tf_config({"worker": ["a:1"]}, "worker", 1), "task.index 1 is out of range for job 'worker'"),
    (tf_config({"worker": ["a:1"]}, "worker", "0"), "task.index '0' is out of range"),
    (json.dumps({"cluster": {"worker": ["a:1"]}}), "'task' must be an object"),
])
def test_a_malformed_tf_config_names_the_problem(text, message):
    with pytest.raises(ClusterError, match="TF_CONFIG") as raised:
        parse_tf_config(text)
    assert message in str(raised.value)
    assert raised.value.exit_code == 2


def test_tasks_of_lists_chief_then_workers_then_ps_and_round_trips_tf_config():
    tasks = tasks_of({"ps": ["p:1"], "worker": ["a:1", "b:1"], "chief": ["c:1"]})
    assert [t.name for t in tasks] == ["chief-0", "worker-0", "worker-1", "ps-0"]
    again = parse_tf_config(tasks[2].to_tf_config())
    assert (again.task_type, again.task_index, dict(again.cluster)) == ("worker", 1, dict(tasks[2].cluster))
