"""The cluster examples under examples/: the TF_CONFIG they lead to is understood
by tfdist.cluster_spec, and the stage options they pass are valid.

Kubeflow's training operator builds TF_CONFIG from a TFJob as
``operator_tf_config`` does (pkg/controller.v1/tensorflow/tensorflow.go):
one address ``<job>-<replica type>-<i>.<namespace>.svc:<tfjob-port>`` per
replica, evaluators left out, task type lower-cased.
"""

import json
import os
import re
import socket
import subprocess
import sys

import pytest
import yaml

from stages import train
from tfdist.cluster_spec import check_cluster, parse_tf_config
from tfdist.strategies import get_spec

from conftest import REPO, tiny_params

KUBEFLOW = sorted((REPO / "examples" / "kubeflow").glob("tfjob-*.yaml"))
HANDMADE = REPO / "examples" / "handmade"
RUN_TASK = HANDMADE / "run-task.sh"


def operator_tf_config(job: dict, replica_type: str, index: int, namespace: str = "default") -> str:
    cluster = {}
    for rtype, spec in job["spec"]["tfReplicaSpecs"].items():
        if rtype == "Evaluator":
            continue
        container = _tensorflow_container(spec)
        port = next((p["containerPort"] for p in container.get("ports", []) if p.get("name") == "tfjob-port"), 2222)
        name = job["metadata"]["name"]
        cluster[rtype.lower()] = [f"{name}-{rtype.lower()}-{i}.{namespace}.svc:{port}" for i in range(spec["replicas"])]
    return json.dumps({"cluster": cluster, "task": {"type": replica_type.lower(), "index": index}, "environment": "cloud"})


def _tensorflow_container(spec: dict) -> dict:
    containers = spec["template"]["spec"]["containers"]
    named = [c for c in containers if c["name"] == "tensorflow"]
    assert len(named) == 1, "the training operator needs one container named 'tensorflow'"
    return named[0]


def test_there_is_a_manifest_per_multi_process_strategy():
    assert [p.name for p in KUBEFLOW] == ["tfjob-multi-worker-mirrored.yaml", "tfjob-parameter-server.yaml"]


@pytest.mark.parametrize("path", KUBEFLOW, ids=lambda p: p.name)
def test_every_task_of_a_tfjob_gets_a_tf_config_the_project_accepts(path):
    (job,) = list(yaml.safe_load_all(path.read_text()))
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "TFJob")
    chiefs = 0
    for rtype, spec in job["spec"]["tfReplicaSpecs"].items():
        container = _tensorflow_container(spec)
        assert container["command"] == ["python", "-m", "stages.train"]
        context = train.main.make_context("train", list(container["args"]))  # the stage accepts its options
        strategy = context.params["strategy"]
        assert strategy == path.stem.removeprefix("tfjob-").replace("-", "_")
        assert context.params["data_dir"].is_absolute(), "every task must find the shared prepared data"
        assert str(context.params["backups_dir"]).startswith("/shared/"), "a restarted task resumes from shared backups"
        assert any(arg.startswith("--set=mlflow.tracking_uri=http") for arg in container["args"]), "a server, not sqlite"
        for index in range(spec["replicas"]):
            task = parse_tf_config(operator_tf_config(job, rtype, index))
            check_cluster(task, get_spec(strategy))
            chiefs += task.is_chief
    assert chiefs == 1, "exactly one task writes the outputs"


@pytest.mark.parametrize(("cluster_file", "strategy"), [
    ("cluster-multi-worker-mirrored.json", "multi_worker_mirrored"),
    ("cluster-parameter-server.json", "parameter_server"),
])
def test_the_handmade_script_gives_each_task_its_tf_config(cluster_file, strategy):
    cluster = json.loads((HANDMADE / cluster_file).read_text())
    names = []
    for job, addresses in cluster.items():
        for index in range(len(addresses)):
            printed = subprocess.run(
                [str(RUN_TASK), str(HANDMADE / cluster_file), job, str(index)],
                env={**os.environ, "PRINT_TF_CONFIG": "1"}, capture_output=True, text=True, check=True,
            ).stdout
            task = parse_tf_config(printed)
            check_cluster(task, get_spec(strategy))
            names.append(task.name)
    assert len(names) == sum(len(a) for a in cluster.values())


@pytest.mark.parametrize(("args", "message"), [
    (["x.json", "worker"], "usage:"),
    ([str(HANDMADE / "cluster-parameter-server.json"), "worker", "one"], "INDEX must be a number, got 'one'"),
    (["missing.json", "worker", "0"], "cluster file missing.json not found"),
])
def test_the_handmade_script_refuses_bad_arguments(args, message):
    result = subprocess.run([str(RUN_TASK), *args], capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr


@pytest.mark.slow
def test_a_handmade_loopback_cluster_trains_with_the_chief_writing_alone(tmp_path, prepared_copy):
    """Cluster mode end to end, without the local launcher: two tasks started by hand."""
    params = tiny_params(tmp_path, train={"epochs": 2, "batch_size": 25})
    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps({"worker": [f"127.0.0.1:{p}" for p in ports]}))
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    options = ["--params", str(params), "--strategy", "multi_worker_mirrored", "--name", "mwms",
               "--data", str(prepared_copy), "--models", str(tmp_path / "models"), "--reports", str(tmp_path / "reports")]
    tasks = [
        subprocess.Popen([str(RUN_TASK), str(cluster_file), "worker", str(i), *options], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]
    outputs = [task.communicate(timeout=240)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], outputs[1][-2000:]
    assert "cluster mode: this process is worker-1 of 2 workers" in outputs[1]
    report = json.loads((tmp_path / "reports" / "mwms.json").read_text())
    assert report["replicas"] == 2 and report["val_accuracy"] > 0.8
    digest = re.search(r"worker-1: final weights sha256 (\w+); not the chief", outputs[1])
    assert digest and digest[1] == report["weights_sha256"]
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["mwms"]
