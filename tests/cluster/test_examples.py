"""The cluster examples under examples/: the TF_CONFIG they lead to is understood
by tfdist.distribute.cluster_spec, and the stage options they pass are valid.

Kubeflow's training operator (v1, legacy) builds TF_CONFIG from a TFJob as
``operator_tf_config`` does (pkg/controller.v1/tensorflow/tensorflow.go):
one address ``<job>-<replica type>-<i>.<namespace>.svc:<tfjob-port>`` per
replica, evaluators left out, task type lower-cased.

Kubeflow Trainer v2's TrainJob and TrainingRuntime manifests are checked
against the published API models (``kubeflow-trainer-api``): every field
must be one of theirs, with its type. Each pod's environment (JobSet labels
through the downward API, Kubernetes' completion index) is built as a cluster
would, and must give tfdist a cluster the strategy accepts.
"""

import json
import os
import re
import socket
import subprocess
import sys

import pytest
import yaml
from kubeflow_trainer_api import models as trainer_api

from stages import train
from tfdist.distribute.cluster_spec import JOBSET_PORT, ClusterError, check_cluster, parse_tf_config, read_jobset
from tfdist.distribute.registry import get_spec

from helpers.project import REPO, tiny_params

KUBEFLOW = sorted((REPO / "examples" / "kubeflow").glob("tfjob-*.yaml"))
TRAINJOBS = sorted((REPO / "examples" / "kubeflow").glob("trainjob-*.yaml"))
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


def test_there_is_a_trainjob_per_multi_process_strategy_and_the_tfjobs_say_they_are_legacy():
    assert [p.name for p in TRAINJOBS] == ["trainjob-multi-worker-mirrored.yaml", "trainjob-parameter-server.yaml"]
    assert all(path.read_text().startswith("# LEGACY: TFJob") for path in KUBEFLOW)


def contained(mine, theirs, where="") -> list[str]:
    """Where ``mine`` has a field or value ``theirs`` (the model's round trip) lacks: [] when none."""
    if isinstance(mine, dict):
        if not isinstance(theirs, dict):
            return [f"{where}: not an object"]
        return [problem for key, value in mine.items()
                for problem in (contained(value, theirs[key], f"{where}.{key}") if key in theirs
                                else [f"{where}.{key}: not a field of the published API"])]
    if isinstance(mine, list):
        if not isinstance(theirs, list) or len(mine) != len(theirs):
            return [f"{where}: list changed"]
        return [problem for i, (a, b) in enumerate(zip(mine, theirs, strict=True))
                for problem in contained(a, b, f"{where}[{i}]")]
    return [] if mine == theirs else [f"{where}: {mine!r} became {theirs!r}"]


def trainjob_documents(path):
    documents = {doc["kind"]: doc for doc in yaml.safe_load_all(path.read_text())}
    assert set(documents) == {"TrainingRuntime", "TrainJob"}
    return documents["TrainingRuntime"], documents["TrainJob"]


@pytest.mark.parametrize("path", TRAINJOBS, ids=lambda p: p.name)
def test_the_trainjob_manifests_are_valid_against_the_published_trainer_api(path):
    runtime, job = trainjob_documents(path)
    for document, model in ((runtime, trainer_api.TrainerV1alpha1TrainingRuntime), (job, trainer_api.TrainerV1alpha1TrainJob)):
        assert document["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
        assert contained(document, model.from_dict(document).to_dict()) == []
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                         "name": runtime["metadata"]["name"]}


def test_a_misspelt_field_is_caught_by_the_check():
    runtime, _ = trainjob_documents(TRAINJOBS[0])
    runtime["spec"]["template"]["spec"]["network"]["enableDNSHostname"] = True
    model = trainer_api.TrainerV1alpha1TrainingRuntime.from_dict(runtime)
    assert contained(runtime, model.to_dict()) == [
        ".spec.template.spec.network.enableDNSHostname: not a field of the published API"]


def pod_environments(path):
    """Every pod's (replicated job, environment) as JobSet and Kubernetes would give it."""
    runtime, job = trainjob_documents(path)
    name = job["metadata"]["name"]
    for replicated in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        labels = replicated["template"].get("metadata", {}).get("labels", {})
        trainer = labels.get("trainer.kubeflow.org/trainjob-ancestor-step") == "trainer"
        pods = job["spec"]["trainer"]["numNodes"] if trainer else replicated["template"]["spec"].get("parallelism", 1)
        (container,) = replicated["template"]["spec"]["template"]["spec"]["containers"]
        pod_labels = {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": replicated["name"]}
        for index in range(pods):
            env = {"JOB_COMPLETION_INDEX": str(index)}
            for variable in container["env"]:
                if "value" in variable:
                    env[variable["name"]] = variable["value"]
                else:
                    label = re.fullmatch(r"metadata\.labels\['(.+)'\]", variable["valueFrom"]["fieldRef"]["fieldPath"])
                    env[variable["name"]] = pod_labels[label.group(1)]
            yield replicated["name"], index, container, env


@pytest.mark.parametrize("path", TRAINJOBS, ids=lambda p: p.name)
def test_every_pod_of_a_trainjob_gets_a_cluster_the_project_accepts(path):
    strategy = path.stem.removeprefix("trainjob-").replace("-", "_")
    name = trainjob_documents(path)[1]["metadata"]["name"]
    tasks = []
    for replicated, index, container, env in pod_environments(path):
        assert container["command"] == ["python", "-m", "stages.train"]
        context = train.main.make_context("train", list(container["args"]))
        assert context.params["strategy"] == strategy
        assert str(context.params["backups_dir"]).startswith("/shared/"), "a restarted set resumes from shared backups"
        assert container["ports"] == [{"containerPort": JOBSET_PORT}]
        task = read_jobset(env)
        check_cluster(task, get_spec(strategy))
        assert task.cluster[task.task_type][task.task_index] == f"{name}-{replicated}-0-{index}.{name}:{JOBSET_PORT}"
        tasks.append(task)
    assert sum(task.is_chief for task in tasks) == 1, "exactly one task writes the outputs"
    assert sorted(task.name for task in tasks) == sorted(f"{job}-{i}" for job, addresses in tasks[0].cluster.items()
                                                         for i in range(len(addresses))), "every task has its pod"


@pytest.mark.parametrize(("env", "message"), [
    ({"TFDIST_JOBSET_JOBS": "worker=node"}, "'worker=node' must look like <tf job>=<replicated job>:<pods>"),
    ({"TFDIST_JOBSET_JOBS": "learner=node:2"}, "'learner=node:2' must look like"),
    ({"TFDIST_JOBSET_JOBS": "worker=node:2", "JOB_COMPLETION_INDEX": "0"},
     "TFDIST_JOBSET_JOBS is set but TFDIST_JOBSET_NAME, TFDIST_REPLICATED_JOB is not"),
    ({"TFDIST_JOBSET_JOBS": "worker=node:2", "TFDIST_JOBSET_NAME": "j", "TFDIST_REPLICATED_JOB": "ps",
      "JOB_COMPLETION_INDEX": "0"}, "TFDIST_REPLICATED_JOB 'ps' is not a replicated job of TFDIST_JOBSET_JOBS"),
    ({"TFDIST_JOBSET_JOBS": "worker=node:2", "TFDIST_JOBSET_NAME": "j", "TFDIST_REPLICATED_JOB": "node",
      "JOB_COMPLETION_INDEX": "2"}, "task.index 2 is out of range for job 'worker'"),
])
def test_a_bad_jobset_environment_is_refused_naming_the_variable(env, message):
    with pytest.raises(ClusterError, match=re.escape(message)):
        read_jobset(env)
    assert read_jobset({}) is None


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
