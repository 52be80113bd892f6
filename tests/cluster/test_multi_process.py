"""multi_worker_mirrored and parameter_server for real: the train stage launches
local worker and ps processes on loopback, as `dvc repro` does.

Each test runs the stage as a subprocess (its tasks need their own TensorFlow
runtimes), then checks the model it wrote on the test split.
"""

import json
import os
import re
import signal
import subprocess
import time

import mlflow
import pytest

from tfdist.data.prepared import load_split
from tfdist.evaluate.stage import evaluate_model

from helpers.digits import MNIST
from helpers.project import REPO, local_mode_environment, process_alive, tiny_params, train_stage_command

pytestmark = pytest.mark.slow


def run_stage(workdir, strategy, *sets, timeout=240):
    return subprocess.run(train_stage_command(workdir, strategy, None, *sets), cwd=REPO, env=local_mode_environment(),
                          capture_output=True, text=True, timeout=timeout)


def accuracy_on_test(workdir, name):
    from tfdist.tracking import models

    model = models.load_model(workdir / "models" / name)
    metrics, _ = evaluate_model(model, load_split(workdir / "data" / "prepared", "test", MNIST), MNIST)
    return metrics["accuracy"]


@pytest.fixture
def workdir(tmp_path, prepared_copy):
    tiny_params(tmp_path, train={"epochs": 3, "batch_size": 25})
    return tmp_path


def mlflow_run(workdir, run_id):
    mlflow.set_tracking_uri(f"sqlite:///{workdir}/mlruns/mlflow.db")
    return mlflow.get_run(run_id)


def test_multi_worker_mirrored_trains_two_local_workers_to_identical_weights(workdir):
    # The default fit loop runs in the dvc repro end-to-end test; here the custom loop, float16 and clipping.
    result = run_stage(workdir, "multi_worker_mirrored", "train.loop=custom", "train.precision=mixed_float16",
                       "train.clip.method=global_norm")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((workdir / "reports" / "multi_worker_mirrored.json").read_text())
    assert (report["replicas"], report["workers"], report["ps"], report["synchronous"]) == (2, 2, 0, True)
    assert report["global_batch_size"] == 50
    history = [row.split(",") for row in (workdir / "reports" / "history" / "multi_worker_mirrored.csv").read_text().split()]
    val_accuracy = [float(row[history[0].index("val_accuracy")]) for row in history[1:]]
    assert 0.5 < max(val_accuracy) <= 1.0, "the workers' validation, read across them (not their sum: 1.8 before)"
    digests = dict(re.findall(r"\[(worker-\d)\] INFO tfdist\.[\w.]+: worker-\d: final weights sha256 (\w+)", result.stderr))
    assert set(digests) == {"worker-0", "worker-1"}, result.stderr[-3000:]
    assert digests["worker-0"] == digests["worker-1"] == report["weights_sha256"]
    cpus = dict(re.findall(r"started (worker-\d) \(pid \d+, on CPU (\d+)\)", result.stderr))
    if len(os.sched_getaffinity(0)) >= 2:
        assert set(cpus) == {"worker-0", "worker-1"} and len(set(cpus.values())) == 2, "a CPU of its own each"
    assert accuracy_on_test(workdir, "multi_worker_mirrored") >= 0.8
    run = mlflow_run(workdir, report["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["strategy.workers"] == "2" and run.data.tags["synchronous"] == "True"
    assert run.data.tags["precision"] == "mixed_float16" and run.data.tags["precision.can_be_faster"] == "False"
    assert "gradient_norm" in run.data.metrics
    assert not list((workdir / "models").glob(".*")), "no temporary output left behind"
    # both workers timed their all-reduce together after training: the compare stage's calibration
    costs = report["collectives"]
    assert (costs["workers"], costs["small_bytes"], costs["large_bytes"]) == (2, 4, 407_080), "the MLP's float32 gradients"
    assert 0 < costs["latency_seconds"] < costs["large_seconds"] < 1 and 0 < costs["seconds_per_byte"] < 1e-6
    assert run.data.metrics["allreduce_latency_ms"] == pytest.approx(1e3 * costs["latency_seconds"])
    assert len(re.findall(r"\[worker-\d\] INFO tfdist\.train\.task_run: multi_worker_mirrored: all-reduce between 2 "
                          r"workers", result.stderr)) == 2


def test_parameter_server_trains_asynchronously_with_local_workers_and_ps(workdir):
    result = run_stage(workdir, "parameter_server", "train.lr_scaling=linear", "train.warmup_epochs=1",
                       "train.loop=custom", "train.precision=mixed_bfloat16", "train.clip.method=norm")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((workdir / "reports" / "parameter_server.json").read_text())
    assert (report["workers"], report["ps"], report["synchronous"]) == (2, 1, False)
    assert report["replicas"] == 1 and report["global_batch_size"] == 25, "a step is one worker's batch"
    assert report["collectives"] is None, "no all-reduce across workers to calibrate"
    if len(os.sched_getaffinity(0)) >= 2:  # each worker on a CPU of its own, and its server keeps two inter-op threads
        cpus = dict(re.findall(r"started (worker-\d|ps-\d) \(pid \d+(?:, on CPU (\d+))?\)", result.stderr))
        assert set(cpus) == {"worker-0", "worker-1", "ps-0"}, result.stderr[-3000:]
        assert cpus["worker-0"] != cpus["worker-1"] and cpus["ps-0"] == "", "the workers pinned, the ps free"
    assert report["learning_rate"] == pytest.approx(0.001) and report["warmup_steps"] == report["steps_per_epoch"]
    assert accuracy_on_test(workdir, "parameter_server") >= 0.8
    run = mlflow_run(workdir, report["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["synchronous"] == "False"
    assert run.data.params["strategy.ps"] == "1" and run.data.tags["loop"] == "custom"
    assert report["precision"] == "mixed_bfloat16" and report["clip_method"] == "norm"
    assert "Failed to remove function remotely" not in result.stderr, "the coordinator disconnects before the ps stop"


#: Seconds from a task's SIGKILL to the stage's exit (see the test below).
STOPPED_WITHIN = 60


@pytest.mark.parametrize(("strategy", "victim"), [("multi_worker_mirrored", "worker-1"), ("parameter_server", "ps-0")])
def test_a_killed_task_fails_the_stage_fast_naming_it_and_leaving_nothing(workdir, strategy, victim):
    launcher = subprocess.Popen(
        train_stage_command(workdir, strategy, None, "train.epochs=200", "distributed.max_restarts=0"), cwd=REPO,
        env=local_mode_environment(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    pids, lines = {}, []
    for line in launcher.stdout:
        lines.append(line)
        if started := re.search(r"started (\S+) \(pid (\d+)", line):
            pids[started[1]] = int(started[2])
        if "Epoch 2/200" in line:  # training is under way on every task
            break
    assert victim in pids, "".join(lines)
    os.kill(pids[victim], signal.SIGKILL)
    killed = time.monotonic()
    rest = launcher.communicate(timeout=120)[0]
    assert launcher.returncode == 1
    # Noticed at once; most of the wait is the launcher closing the chief's MLflow run, which imports MLflow and
    # TensorFlow: 7-10 s on the AMD EPYC, 21-22 s on a loaded Intel Xeon (CI). The bound leaves ~3x room.
    assert time.monotonic() - killed < STOPPED_WITHIN
    error = rest.strip().splitlines()
    assert any(f"task {victim} (pid {pids[victim]}) was killed by SIGKILL" in line for line in error[-12:]), rest[-3000:]
    time.sleep(0.5)
    assert not [name for name, pid in pids.items() if process_alive(pid)]
    assert not (workdir / "models" / strategy).exists() and not (workdir / "reports" / f"{strategy}.json").exists()
    mlflow.set_tracking_uri(f"sqlite:///{workdir}/mlruns/mlflow.db")
    statuses = {run.info.status for run in mlflow.search_runs(experiment_names=["tests"], output_format="list",
                                                               filter_string="tags.stage = 'train'")}
    assert statuses <= {"FAILED", "KILLED"} and statuses, "the run is closed, not left RUNNING"


def test_parameter_server_validates_exactly_even_with_fewer_batches_than_shards(workdir):
    # 400 validation digits at batch 500 make 1 batch; exact evaluation wants a shard for each of the 2 workers.
    result = run_stage(workdir, "parameter_server", "train.batch_size=500", "train.epochs=2")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((workdir / "reports" / "parameter_server.json").read_text())
    assert 0 < report["val_accuracy"] <= 1
