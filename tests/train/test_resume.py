"""Resume after a crash: real SIGKILLs on real stage processes, then the rerun.

Slow tests: each runs the train stage as a subprocess (a kill must hit a real
process), on the sample with a small batch so an epoch lasts long enough to
be interrupted.
"""

import json
import os
import re
import signal
import subprocess
import time

import mlflow
import pytest
from click.testing import CliRunner

from stages import train

from helpers.project import REPO, local_mode_environment, process_alive, tiny_params, train_stage_command

EPOCHS = 6


@pytest.fixture
def workdir(tmp_path, prepared_copy):
    tiny_params(tmp_path, train={"epochs": EPOCHS, "batch_size": 8, "steps_per_execution": 25})
    return tmp_path


def start(workdir, strategy, name, *sets):
    return subprocess.Popen(train_stage_command(workdir, strategy, name, *sets), cwd=REPO, env=local_mode_environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_until(process, pattern, lines):
    for line in process.stdout:
        lines.append(line)
        if found := re.search(pattern, line):
            return found
    raise AssertionError(f"{pattern!r} never appeared:\n{''.join(lines[-30:])}")


def finished(workdir, strategy, name):
    result = subprocess.run(train_stage_command(workdir, strategy, name), cwd=REPO, env=local_mode_environment(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr + result.stdout


def runs(workdir):
    mlflow.set_tracking_uri(f"sqlite:///{workdir}/mlruns/mlflow.db")
    return mlflow.search_runs(experiment_names=["tests"], filter_string="tags.stage = 'train'", output_format="list")


def metric_steps(run, key):
    return sorted(m.step for m in mlflow.MlflowClient().get_metric_history(run.info.run_id, key))


pytestmark = pytest.mark.slow


# The plain checkpoint, and BackupAndRestore of a model split over two devices (a kill at a moment of the
# log's choosing; default and the other strategies are killed at every crash point in tests/test_crash_points.py)
@pytest.mark.parametrize("strategy", ["central_storage", "pipeline_parallel"])
def test_a_killed_run_resumes_from_its_last_epoch_in_the_same_mlflow_run(workdir, strategy):
    if strategy == "pipeline_parallel":
        tiny_params(workdir, train={"epochs": EPOCHS, "batch_size": 8, "steps_per_execution": 25, "loop": "custom"},
                    distributed={"micro_batches": 4})
    process = start(workdir, strategy, "crash")
    read_until(process, rf"Epoch 3/{EPOCHS}", [])  # epochs 1 and 2 are done and backed up
    process.send_signal(signal.SIGKILL)
    process.wait()
    (state_file,) = (workdir / "backups" / "crash").glob("*/state.json")
    done = max(row["epoch"] for row in json.loads(state_file.read_text())["history"])
    assert done >= 2

    output = finished(workdir, strategy, "crash")
    resumed = re.search(r"resuming from the backup in .*: epochs 1-(\d+) are done, continuing at epoch (\d+)", output)
    assert resumed and int(resumed[1]) >= done and int(resumed[2]) == int(resumed[1]) + 1, output[-2000:]
    report = json.loads((workdir / "reports" / "crash.json").read_text())
    assert report["resumed_at_epoch"] == int(resumed[1]) and report["epochs"] == EPOCHS
    history = (workdir / "reports" / "history" / "crash.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in history[1:]] == [str(e) for e in range(1, EPOCHS + 1)]
    assert not (workdir / "backups" / "crash").exists(), "the backup is removed after success"

    # an uninterrupted run reaches 0.93 here, resumed ones too (a fresh run beside each cost 15-25 s of CI)
    assert report["val_accuracy"] > 0.85, "the resumed model learned"

    (run,) = [r for r in runs(workdir) if r.data.tags["model_name"] == "crash"]
    assert run.info.status == "FINISHED"
    assert set(metric_steps(run, "val_accuracy")) == set(range(1, EPOCHS + 1)), "the full metric history, one run"


def test_a_local_multi_worker_run_restarts_its_tasks_when_one_is_killed(workdir):
    # Twice the epochs of the other tests: an epoch takes ~1 s, and on a loaded machine the launcher
    # relays "Epoch 3/" late enough that a 6-epoch run could finish before the kill.
    epochs = 2 * EPOCHS
    process = start(workdir, "multi_worker_mirrored", "mwms", f"train.epochs={epochs}")
    lines = []
    read_until(process, rf"\[worker-0\] Epoch 3/{epochs}", lines)
    victim = int(re.search(r"started worker-1 \(pid (\d+)", "".join(lines))[1])
    os.kill(victim, signal.SIGKILL)
    output = "".join(lines) + process.communicate(timeout=300)[0]
    assert process.returncode == 0, output[-3000:]
    assert f"task worker-1 (pid {victim}) was killed by SIGKILL" in output
    assert "restarting every task (restart 1 of 1)" in output
    assert re.search(r"\[worker-0\] INFO tfdist.resume: resuming from the backup .* continuing at epoch [3-9]", output)
    report = json.loads((workdir / "reports" / "mwms.json").read_text())
    assert report["epochs"] == epochs and report["resumed_at_epoch"] >= 2 and report["val_accuracy"] > 0.85
    (run,) = runs(workdir)
    assert run.info.status == "FINISHED"
    assert set(metric_steps(run, "val_accuracy")) == set(range(1, epochs + 1))
    assert not process_alive(victim)


def test_past_max_restarts_the_launcher_gives_up_naming_the_task(workdir):
    process = start(workdir, "multi_worker_mirrored", "mwms", "distributed.max_restarts=0")
    lines = []
    read_until(process, rf"\[worker-0\] Epoch 2/{EPOCHS}", lines)
    victim = int(re.search(r"started worker-1 \(pid (\d+)", "".join(lines))[1])
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    output = process.communicate(timeout=120)[0]
    # As in test_multi_process: closing the chief's run imports MLflow and TensorFlow (21 s on a loaded Intel Xeon,
    # 20.45 s once on a fresh clone's CI); the bound leaves ~3x room.
    assert process.returncode == 1 and time.monotonic() - killed < 60
    assert f"task worker-1 (pid {victim}) was killed by SIGKILL" in output
    assert "gave up after 0 restart(s): distributed.max_restarts is 0" in output
    (run,) = runs(workdir)
    assert run.info.status == "FAILED"


def test_changed_params_start_fresh_and_close_the_abandoned_run(workdir, monkeypatch):
    """What a killed run leaves behind: a backup under the old params, its MLflow run still RUNNING."""
    mlflow.set_tracking_uri(f"sqlite:///{workdir}/mlruns/mlflow.db")
    mlflow.set_experiment("tests")
    abandoned = mlflow.start_run(run_name="run")
    mlflow.end_run("RUNNING")  # leave it as a SIGKILL would
    assert mlflow.get_run(abandoned.info.run_id).info.status == "RUNNING"
    old = workdir / "backups" / "run" / "0123456789abcdef"
    old.mkdir(parents=True)
    (old / "state.json").write_text(json.dumps({"mlflow_run_id": abandoned.info.run_id, "history": []}))

    monkeypatch.chdir(workdir)
    result = CliRunner().invoke(train.main, ["--strategy", "default", "--name", "run", "--backups", "backups",
                                             "--set", "train.epochs=1"])
    assert result.exit_code == 0, result.output
    assert mlflow.get_run(abandoned.info.run_id).info.status == "KILLED"
    assert not old.exists()
    report = json.loads((workdir / "reports" / "train" / "run.json").read_text())
    assert report["resumed_at_epoch"] == 0 and report["mlflow_run_id"] != abandoned.info.run_id


def test_stages_running_at_once_share_a_fresh_sqlite_store(workdir):
    """As `dvc queue start -j 2` runs experiments: several train stages, one new store."""
    # batch 50: the stages need to overlap, not to train long (at this file's batch 8 it cost CI 15 s more)
    processes = [start(workdir, "default", f"queued-{i}", "train.epochs=2", "train.batch_size=50") for i in range(3)]
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0], "\n".join(o[-1500:] for o in outputs)
    assert not [o for o in outputs if "database is locked" in o or "Traceback" in o]
    assert sorted((r.info.run_name, r.info.status) for r in runs(workdir)) == [
        (f"queued-{i} · fit · float32", "FINISHED") for i in range(3)
    ]
