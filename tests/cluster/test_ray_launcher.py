"""Ray as the launcher (distributed.launcher: ray) on a local Ray cluster pinned to 127.0.0.1; across machines and
its faults: test_ray_hosts.py."""

import json
import os
import socket
import subprocess
import sys
import time

import mlflow
import pytest

from tfdist.cluster.ray_launcher import launch_ray
from tfdist.config.params import load_config
from tfdist.distribute.registry import get_spec
from tfdist.errors import InputError

from helpers.project import LAUNCHER_TRAIN, REPO, local_mode_environment, tiny_params, train_stage_command


def report(workdir, name):
    return json.loads((workdir / "reports" / f"{name}.json").read_text())


def test_without_ray_installed_the_launcher_says_which_extra_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    config = load_config(tiny_params(tmp_path, distributed={"launcher": "ray"}))
    with pytest.raises(InputError, match=r"^distributed.launcher ray needs Ray: install the ray extra"):
        launch_ray(get_spec("multi_worker_mirrored"), config.distributed, ["true"], on_stop=lambda status: None)


def test_a_ray_cluster_that_does_not_answer_fails_in_seconds_naming_its_address(tmp_path, prepared_copy):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed
    tiny_params(tmp_path, distributed={"launcher": "ray", "ray_address": f"127.0.0.1:{port}"})
    started = time.monotonic()
    result = subprocess.run(train_stage_command(tmp_path, "multi_worker_mirrored"), cwd=REPO, env=local_mode_environment(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and time.monotonic() - started < 30
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: the Ray cluster at 127.0.0.1:{port} does not answer (Connection refused): start it (ray start --head) "
        "or fix distributed.ray_address; local starts one here")
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_ray_trains_the_same_weights_as_the_local_launcher_on_loopback_and_logs_the_chief_s_run(tmp_path, prepared_copy,
                                                                                            local_launcher_run):
    tiny_params(tmp_path, train=LAUNCHER_TRAIN)
    # Paths relative to the stage's folder, as dvc.yaml gives them: Ray runs its workers in folders of its own.
    relative = [arg if not arg.startswith(str(tmp_path)) else os.path.relpath(arg, tmp_path)
                for arg in train_stage_command(tmp_path, "multi_worker_mirrored", "ray", "distributed.launcher=ray")]
    under_ray = subprocess.run(relative, cwd=tmp_path, env=local_mode_environment(), capture_output=True, text=True,
                               timeout=300)
    assert under_ray.returncode == 0, under_ray.stderr[-3000:]
    assert report(tmp_path, "ray")["weights_sha256"] == local_launcher_run["weights_sha256"]
    assert report(tmp_path, "ray")["hardware"]["hosts"] == local_launcher_run["hardware"]["hosts"]
    stderr = under_ray.stderr
    assert "on a local Ray cluster on 127.0.0.1" in stderr
    assert "[worker-1] INFO tfdist.train.task_run: worker-1: final weights sha256" in stderr
    for noise in ("oneDNN", "absl::InitializeLog", "PreemptionWatcher", "Traceback", "Requesting resources"):
        assert noise not in stderr
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    run = mlflow.get_run(report(tmp_path, "ray")["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["model_name"] == "ray"
