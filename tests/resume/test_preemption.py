"""Preemption: a SIGTERM mid-epoch backs the run up at the next step and ends it (exit 75, MLflow KILLED and tagged);
the same command goes on from that step, to the uninterrupted run's weights. Real signals on real processes."""

import json
import os
import re
import signal
import subprocess
import time

import mlflow
import pytest

from tfdist.errors import Interrupted
from tfdist.resume.within_epoch import Preemption
from tfdist.tracking.runs import PREEMPTED_TAG

from helpers.project import REPO, local_mode_environment, tiny_params, train_stage_command


def test_a_sigterm_asks_for_a_backup_and_a_second_one_or_the_bound_stops_at_once():
    with Preemption(bound=30).listening() as preemption:
        os.kill(os.getpid(), signal.SIGTERM)
        assert preemption.requested, "the first SIGTERM is a notice: the process goes on to back up"
        with pytest.raises(Interrupted, match="second SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(Interrupted, match="no step boundary came within 1 s"):
        with Preemption(bound=1).listening():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # the alarm ends it after 1 s
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL and signal.alarm(0) == 0, "handlers and alarm put back"


EPOCHS = 2


def _stage(workdir, strategy, name, *, wait=True):
    command = train_stage_command(workdir, strategy, name)
    if wait:
        done = subprocess.run(command, cwd=REPO, env=local_mode_environment(), capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stderr + done.stdout
    return subprocess.Popen(command, cwd=REPO, env=local_mode_environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _preempted(workdir, strategy, name, epochs=EPOCHS):
    """Run the train stage, SIGTERM it a moment into epoch 2: its output, once it exited 75 within the bound."""
    process = _stage(workdir, strategy, name, wait=False)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if f"Epoch 2/{epochs}" in line:
            break
    time.sleep(0.3)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=60)
    stopped = time.monotonic() - signalled
    output = "".join(lines) + rest
    assert process.returncode == 75, output[-3000:]
    assert stopped < 20, f"{stopped:.1f} s from SIGTERM to exit"
    return output


def _run(workdir, name):
    mlflow.set_tracking_uri(f"sqlite:///{workdir}/mlruns/mlflow.db")
    (run,) = mlflow.search_runs(experiment_names=["tests"], filter_string=f"tags.model_name = '{name}'",
                                output_format="list")
    return run


def _one_finished_run(workdir, name, epochs=EPOCHS):
    run = _run(workdir, name)
    assert run.info.status == "FINISHED"
    steps = sorted(m.step for m in mlflow.MlflowClient().get_metric_history(run.info.run_id, "loss"))
    assert steps == list(range(1, epochs + 1)), "every epoch's metrics once, in the one run"


#: The cnn's steps are slow enough for a signal to land within an epoch; no periodic backups: the signal's only.
PREEMPTED_TRAIN = {"epochs": EPOCHS, "batch_size": 8, "steps_per_execution": 10, "backup_every": 0}


@pytest.mark.slow
# mirrored's replicas back up as default's process does (one process, the strategy's checkpoint), and a cluster's
# several replicas agree on the step in multi_worker_mirrored's: its case went, to pay for the profiling test.
@pytest.mark.parametrize("strategy", ["default", "multi_worker_mirrored"])
def test_sigterm_mid_epoch_backs_up_and_the_rerun_goes_on_from_that_step(tmp_path, prepared_copy, strategy):
    tiny_params(tmp_path, model={"kind": "cnn"}, train=PREEMPTED_TRAIN)
    name = f"{strategy}-preempted"
    output = _preempted(tmp_path, strategy, name)
    where = re.search(r"preempted \(SIGTERM\): backed up at epoch (\d), step (\d+); run the same command again", output)
    assert where, output[-3000:]
    (state,) = (tmp_path / "backups" / name).glob("*/steps/steps.json")
    step = json.loads(state.read_text())
    assert (step["epoch"] + 1, step["step"]) == (int(where[1]), int(where[2]))
    run = _run(tmp_path, name)
    assert run.info.status == "KILLED" and run.data.tags[PREEMPTED_TAG] == f"backed up at epoch {where[1]}, step {where[2]}"

    resumed = _stage(tmp_path, strategy, name)
    assert f"resuming within epoch {where[1]}: its steps 1-{where[2]} are done" in resumed, resumed[-3000:]
    _stage(tmp_path, strategy, f"{strategy}-whole")
    report, whole = (json.loads((tmp_path / "reports" / f"{n}.json").read_text()) for n in (name, f"{strategy}-whole"))
    assert report["weights_sha256"] == whole["weights_sha256"], "the weights of a run never stopped, to the byte"
    history, uninterrupted = ((tmp_path / "reports" / "history" / f"{n}.csv").read_text().splitlines()
                              for n in (name, f"{strategy}-whole"))
    columns = history[0].split(",")
    for got, want in zip(history[1:], uninterrupted[1:], strict=True):  # the epochs' metrics: over all their steps
        for column, a, b in zip(columns, got.split(","), want.split(","), strict=True):
            if column in ("loss", "accuracy", "val_loss", "val_accuracy"):
                assert float(a) == pytest.approx(float(b), rel=1e-6), (column, got, want)
    _one_finished_run(tmp_path, name)


@pytest.mark.slow
def test_a_parameter_server_run_preempted_mid_epoch_stops_and_the_rerun_resumes_at_its_last_epoch(tmp_path,
                                                                                                prepared_copy):
    # its steps are scheduled an epoch ahead of the workers: it stops once epoch 2 is backed up, and trains epoch 3
    tiny_params(tmp_path, model={"kind": "cnn"}, train={**PREEMPTED_TRAIN, "epochs": 3}, distributed={"workers": 1})
    output = _preempted(tmp_path, "parameter_server", "ps", epochs=3)
    assert "preempted (SIGTERM): backed up at the end of epoch 2 (parameter_server backs up at epoch ends)" in output
    run = _run(tmp_path, "ps")
    assert run.info.status == "KILLED" and run.data.tags[PREEMPTED_TAG].startswith("backed up at the end of epoch 2")
    resumed = _stage(tmp_path, "parameter_server", "ps")
    assert "epochs 1-2 are done, continuing at epoch 3" in resumed, resumed[-3000:]
    _one_finished_run(tmp_path, "ps", epochs=3)
