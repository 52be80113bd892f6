"""Ray Train as the launcher of multi_worker_mirrored (distributed.launcher: ray), on a local Ray cluster pinned to 127.0.0.1."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import mlflow
import pytest

from tfdist.cluster.ray_launcher import launch_ray
from tfdist.config import load_config
from tfdist.distribute.registry import get_spec
from tfdist.errors import InputError

from helpers.project import REPO, local_mode_environment, tiny_params, train_stage_command
from helpers.servers import free_ports


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


def test_a_ray_cluster_that_does_not_answer_fails_in_seconds_naming_its_address(tmp_path, prepared_copy):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed
    tiny_params(tmp_path, distributed={"launcher": "ray", "ray_address": f"127.0.0.1:{port}"})
    started = time.monotonic()
    result = subprocess.run(train_stage_command(tmp_path, "multi_worker_mirrored"), cwd=REPO, env=local_mode_environment(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and time.monotonic() - started < 30
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: the Ray cluster at 127.0.0.1:{port} does not answer (Connection refused): start it (ray start --head) "
        "or fix distributed.ray_address; local starts one here")
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_ray_trains_the_same_weights_as_the_local_launcher_on_loopback_and_logs_the_chief_s_run(tmp_path, prepared_copy):
    tiny_params(tmp_path, train={"epochs": 2, "batch_size": 25})
    local = run_stage(tmp_path, "local")
    assert local.returncode == 0, local.stderr[-3000:]
    # Paths relative to the stage's folder, as dvc.yaml gives them: Ray runs its workers in folders of its own.
    relative = [arg if not arg.startswith(str(tmp_path)) else os.path.relpath(arg, tmp_path)
                for arg in train_stage_command(tmp_path, "multi_worker_mirrored", "ray", "distributed.launcher=ray")]
    under_ray = subprocess.run(relative, cwd=tmp_path, env=local_mode_environment(), capture_output=True, text=True,
                               timeout=300)
    assert under_ray.returncode == 0, under_ray.stderr[-3000:]
    assert report(tmp_path, "ray")["weights_sha256"] == report(tmp_path, "local")["weights_sha256"]
    assert report(tmp_path, "ray")["hardware"]["hosts"] == report(tmp_path, "local")["hardware"]["hosts"]
    stderr = under_ray.stderr
    assert "on a local Ray cluster on 127.0.0.1" in stderr
    assert "[worker-1] INFO tfdist.train.task_run: worker-1: final weights sha256" in stderr
    for noise in ("oneDNN", "absl::InitializeLog", "PreemptionWatcher", "Traceback", "Requesting resources"):
        assert noise not in stderr
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    run = mlflow.get_run(report(tmp_path, "ray")["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["model_name"] == "ray"


@contextlib.contextmanager
def ray_head(log):
    """A Ray cluster started as a user would (ray start --head), on 127.0.0.1: its address."""
    port = free_ports(1)[0]
    # Every node address 127.0.0.1; and no 30 s drain when the test stops it (its runs are over by then).
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "2"}
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={port}",
                             "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false",
                             "--disable-usage-stats"], env=env, start_new_session=True, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        head.terminate()  # ray start --block drains and stops what it started
        try:
            head.wait(timeout=60)
        finally:
            if head.poll() is None:
                os.killpg(head.pid, signal.SIGKILL)


@pytest.mark.slow
def test_on_a_ray_cluster_it_joins_a_killed_worker_is_restarted_and_training_resumes_from_the_backup(tmp_path,
                                                                                                   prepared_copy):
    with ray_head(tmp_path / "head.log") as address:
        tiny_params(tmp_path, train={"epochs": 8, "batch_size": 25},
                    distributed={"launcher": "ray", "ray_address": address, "max_restarts": 1})
        code, stderr = run_and_kill_worker_1(tmp_path)
    assert code == 0, stderr[-3000:]
    assert f"on the Ray cluster at {address}" in stderr
    assert re.search(r"\[worker-0\] INFO tfdist.train.resume: resuming from the backup .*: epochs 1-\d are done", stderr)
    assert stderr.count("started worker-1") == 2
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    assert mlflow.get_run(report(tmp_path, "ray")["mlflow_run_id"]).info.status == "FINISHED"


def run_and_kill_worker_1(tmp_path):
    """Run the stage; SIGKILL worker-1's task (only it: never a pid not read from the output) at epoch 4."""
    process = subprocess.Popen(train_stage_command(tmp_path, "multi_worker_mirrored", "ray"), cwd=REPO,
                               env=local_mode_environment(), stderr=subprocess.PIPE, text=True)
    lines = []
    timer = threading.Timer(400, process.kill)
    timer.start()
    try:
        victim, killed = None, False
        for line in process.stderr:
            lines.append(line)
            found = re.search(r"started worker-1 \(pid (\d+)", line)
            if found and victim is None:
                victim = int(found.group(1))
            if victim is not None and victim > 1 and not killed and line.startswith("[worker-0] Epoch 4/"):
                os.kill(victim, signal.SIGKILL)
                killed = True
        code = process.wait()
    finally:
        timer.cancel()
    assert killed, "worker-1 was never seen at epoch 4:\n" + "".join(lines)[-3000:]
    return code, "".join(lines)
