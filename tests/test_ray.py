"""Ray Train as the launcher of multi_worker_mirrored (distributed.launcher: ray), on a local Ray cluster pinned to 127.0.0.1."""

import json
import os
import re
import signal
import subprocess
import sys
import threading

import mlflow
import pytest

from tfdist.config import load_config
from tfdist.errors import InputError
from tfdist.ray_launcher import launch_ray
from tfdist.strategies import get_spec

from conftest import REPO, local_mode_environment, tiny_params, train_stage_command


def run_stage(workdir, name, *sets, timeout=300):
    command = train_stage_command(workdir, "multi_worker_mirrored", name, *sets)
    return subprocess.run(command, cwd=REPO, env=local_mode_environment(), capture_output=True, text=True, timeout=timeout)


def report(workdir, name):
    return json.loads((workdir / "reports" / f"{name}.json").read_text())


def test_parameter_server_is_refused_under_ray_in_one_line(tmp_path, prepared_copy):
    tiny_params(tmp_path, distributed={"launcher": "ray"})
    result = subprocess.run(train_stage_command(tmp_path, "parameter_server"), cwd=REPO, env=local_mode_environment(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: strategy parameter_server cannot run under distributed.launcher ray: Ray Train's TensorflowTrainer writes "
        "a TF_CONFIG of workers only (no chief, no ps); use distributed.launcher local, or start its tasks with TF_CONFIG "
        "set (docs/cluster.md)"]
    assert not (tmp_path / "models").exists()


def test_without_ray_installed_the_launcher_says_which_extra_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    config = load_config(tiny_params(tmp_path, distributed={"launcher": "ray"}))
    with pytest.raises(InputError, match=r"^distributed.launcher ray needs Ray Train: install the ray extra"):
        launch_ray(get_spec("multi_worker_mirrored"), config.distributed, ["true"], on_stop=lambda status: None)


@pytest.mark.slow
def test_ray_trains_the_same_weights_as_the_local_launcher_on_loopback_and_logs_the_chief_s_run(tmp_path, prepared_copy):
    tiny_params(tmp_path, train={"epochs": 2, "batch_size": 25})
    local = run_stage(tmp_path, "local")
    assert local.returncode == 0, local.stderr[-3000:]
    under_ray = run_stage(tmp_path, "ray", "distributed.launcher=ray")
    assert under_ray.returncode == 0, under_ray.stderr[-3000:]
    assert report(tmp_path, "ray")["weights_sha256"] == report(tmp_path, "local")["weights_sha256"]
    assert report(tmp_path, "ray")["hardware"]["hosts"] == report(tmp_path, "local")["hardware"]["hosts"]
    stderr = under_ray.stderr
    assert "on a local Ray cluster on 127.0.0.1" in stderr
    assert re.findall(r"\(ip=([\d.]+), pid=", stderr) == ["127.0.0.1", "127.0.0.1"], "Ray must advertise loopback only"
    assert "[worker-1] INFO tfdist.training_run: worker-1: final weights sha256" in stderr
    for noise in ("oneDNN", "absl::InitializeLog", "PreemptionWatcher", "Traceback"):
        assert noise not in stderr
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    run = mlflow.get_run(report(tmp_path, "ray")["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["model_name"] == "ray"


@pytest.mark.slow
def test_a_worker_killed_under_ray_is_restarted_by_ray_and_training_resumes_from_the_backup(tmp_path, prepared_copy):
    tiny_params(tmp_path, train={"epochs": 8, "batch_size": 25}, distributed={"launcher": "ray", "max_restarts": 1})
    process = subprocess.Popen(train_stage_command(tmp_path, "multi_worker_mirrored", "ray"), cwd=REPO,
                               env=local_mode_environment(), stderr=subprocess.PIPE, text=True)
    lines = []
    timer = threading.Timer(400, process.kill)
    timer.start()
    try:
        victim, killed = None, False
        for line in process.stderr:
            lines.append(line)
            found = re.search(r"started worker-1 \(pid (\d+)\)", line)
            if found and victim is None:
                victim = int(found.group(1))
            if victim is not None and victim > 1 and not killed and line.startswith("[worker-0] Epoch 4/"):
                os.kill(victim, signal.SIGKILL)
                killed = True
        code = process.wait()
    finally:
        timer.cancel()
    stderr = "".join(lines)
    assert code == 0, stderr[-3000:]
    assert killed, "worker-1 was never seen at epoch 4"
    assert re.search(r"\[worker-0\] INFO tfdist.resume: resuming from the backup .*: epochs 1-\d are done", stderr)
    assert stderr.count("started worker-1") == 2
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    assert mlflow.get_run(report(tmp_path, "ray")["mlflow_run_id"]).info.status == "FINISHED"
