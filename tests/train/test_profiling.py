"""train.profile_steps: every training task's steady steps traced, the traces in the MLflow run, and `tfdist tensorboard`
serving them (and the runs' curves) behind the doors of tfdist's servers. Real stages, a real TensorBoard."""

import gzip
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest

from tfdist.compare.compute import build_comparison
from tfdist.compare.render import render_markdown
from tfdist.config.params import load_config
from tfdist.distribute.builders import StrategyInfo
from tfdist.distribute.registry import get_spec
from tfdist.errors import InputError
from tfdist.train.fit import FitPlan
from tfdist.train.profiling import ProfileSteps, profile_callback
from tfdist.train.trace_parts import mean_parts, step_parts

from helpers.project import local_mode_environment, tiny_params, train_stage_command
from helpers.reports import eval_report, train_report

PROFILED = {"epochs": 3, "profile_steps": 10, "steps_per_execution": 5}


def test_a_profile_longer_than_an_epoch_or_with_one_epoch_is_refused_naming_the_key(tmp_path):
    info = StrategyInfo("default", "_DefaultDistributionStrategy", 1)
    for train, why in (({"profile_steps": 101}, "100 steps an epoch"), ({"profile_steps": 5, "epochs": 1}, "of 1")):
        config = load_config(tiny_params(tmp_path, train=train))
        with pytest.raises(InputError, match=f"train.profile_steps .*{why}.*set it to at most 100"):
            FitPlan.of(config, get_spec("default"), info, 3200, 100)
    with pytest.raises(InputError, match="train.profile_steps"):
        load_config(tiny_params(tmp_path, train={"profile_steps": -1}))


def test_the_capture_starts_after_the_first_epoch_this_fit_trains(tmp_path):
    assert profile_callback(10, None, 0, 3, 50, False) is None, "no folder: nothing asked"
    assert profile_callback(10, tmp_path, 2, 3, 50, False) is None, "a resumed fit with one epoch left: none steady"
    capture = profile_callback(10, tmp_path, 1, 4, 50, False)
    assert isinstance(capture, ProfileSteps) and capture.epoch == 2
    whole = profile_callback(10, tmp_path, 0, 3, 50, True)
    assert type(whole).__name__ == "ProfileEpoch" and whole.steps == 50, "parameter_server: the whole epoch"


def test_each_run_is_a_folder_of_scalars_named_as_the_ui_names_it(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tfdist.tracking.board_folder import folder_name, write_scalars

    run = SimpleNamespace(info=SimpleNamespace(run_name="normal · default / fit", run_id="0123456789abcdef"))
    assert folder_name(run) == "normal_default_fit-01234567"
    write_scalars(tmp_path / "normal", {"val_accuracy": [(1, 0.9, 1_700_000_000_000), (2, 0.95, 1_700_000_001_000)]})
    events = EventAccumulator(str(tmp_path / "normal"))
    events.Reload()
    assert [(e.step, round(e.value, 3)) for e in events.Scalars("val_accuracy")] == [(1, 0.9), (2, 0.95)]


def test_a_steps_parts_from_two_workers_traces_add_up_to_the_step_and_name_who_waited():
    ms = 10**9  # picoseconds
    reduce = "while/body/_1/while/Adam/CollectiveReduceV2:CollectiveReduceV2"
    op = "while/body/_1/while/cnn/conv2d/Relu:_MklNativeFusedConv2D"
    metric = "while/body/_1/while/div_no_nan/CollectiveReduceV2:CollectiveReduceV2"
    first = [(op, 0, 50 * ms), (reduce, 50 * ms, 60 * ms), (op, 60 * ms, 110 * ms), (reduce, 110 * ms, 121 * ms),
             (metric, 121 * ms, 122 * ms)]
    # the second worker's ops leave 4 ms between them in its second step, and it reaches the all-reduce last
    second = [(op, 0, 55 * ms), (reduce, 55 * ms, 60 * ms), (op, 60 * ms, 100 * ms), (op, 104 * ms, 118 * ms),
              (reduce, 118 * ms, 121 * ms), (metric, 121 * ms, 122 * ms)]
    (step,) = step_parts(first, second)
    assert step == {"step_ms": 61.0, "compute_ms": 54.0, "between_ops_ms": 4.0, "wire_ms": 3.0, "waiting_ms": 8.0}
    assert step["compute_ms"] + step["between_ops_ms"] + step["wire_ms"] == step["step_ms"]


def test_the_typical_steps_parts_add_up_where_a_descheduled_worker_trades_compute_for_time_between_ops():
    ms = 10**9
    reduce = "while/body/_1/while/Adam/CollectiveReduceV2:CollectiveReduceV2"
    op = "while/body/_1/while/cnn/conv2d/Relu:_FusedConv2D"
    first, second, clock = [], [], 0
    # (compute, idle) per step: their medians (12 + 1 + 1 ms wire) miss the median step (18 ms)
    for compute, idle in ((0, 0), (10, 10), (16, 1), (9, 9), (16, 1), (12, 0)):
        for events in (first, second):
            events += [(op, clock, clock + compute * ms), (reduce, clock + (compute + idle) * ms,
                                                           clock + (compute + idle + 1) * ms)]
        clock += (compute + idle + 1) * ms
    parts, steps = mean_parts(first, second)
    assert steps == 5
    assert parts["compute_ms"] + parts["between_ops_ms"] + parts["wire_ms"] == pytest.approx(parts["step_ms"])


def test_the_report_names_a_profiled_run_and_shows_its_steps_parts():
    traced = {"profiled_steps": 10, "profiled_epoch": 2, "traced_step_ms": 4.0, "traced_compute_ms": 2.5,
              "traced_between_ops_ms": 0.5, "traced_wire_ms": 1.0, "traced_waiting_ms": 0.3, "traced_steps": 9}
    comparison = build_comparison(
        {"normal": train_report("default", 10.0),
         "multi_worker_mirrored": replace(train_report("multi_worker_mirrored", 9.0, 2), **traced)},
        {"normal": eval_report("normal", 0.95, 0.2), "multi_worker_mirrored": eval_report("multi_worker_mirrored", 0.95, 0.2)})
    markdown = render_markdown(comparison)
    assert "**Profiled:** multi_worker_mirrored (10 steps of epoch 2)" in markdown
    assert "| multi_worker_mirrored | 4.00 | 2.50 | 0.50 | 1.00 | 0.30 |" in markdown, markdown


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get(url, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            body = answer.read()
            return answer.status, (gzip.decompress(body) if answer.headers.get("Content-Encoding") == "gzip" else body).decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.slow
def test_a_profiled_cluster_run_holds_each_workers_trace_and_tensorboard_serves_them(tmp_path, prepared_copy):
    tiny_params(tmp_path, model={"kind": "cnn"}, train=PROFILED)
    done = subprocess.run(train_stage_command(tmp_path, "multi_worker_mirrored", "profiled"), cwd=tmp_path,
                          env=local_mode_environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "reports" / "profiled.json").read_text())
    assert (report["profiled_epoch"], report["profiled_steps"]) == (2, 10), "steps 1-10 of epoch 2, two calls of 5"
    parts = {key: report[f"traced_{key}"] for key in ("step_ms", "compute_ms", "between_ops_ms", "wire_ms")}
    assert report["traced_steps"] >= 3 and parts["compute_ms"] > 0 and parts["wire_ms"] > 0, report
    added = parts["compute_ms"] + parts["between_ops_ms"] + parts["wire_ms"]
    assert added == pytest.approx(parts["step_ms"], rel=0.10), ("the parts add up to the traced step", parts)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    run = mlflow.MlflowClient().get_run(report["mlflow_run_id"])
    assert run.data.tags["tfdist.profiled"] == "10 steps of epoch 2: worker-0, worker-1"
    traces = [item.path for item in mlflow.MlflowClient().list_artifacts(run.info.run_id, "profile")]
    assert traces == ["profile/worker-0", "profile/worker-1"], traces

    port = _free_port()
    board = subprocess.Popen([sys.executable, "-m", "tfdist_cli", "tensorboard", "--params", str(tmp_path / "params.yaml"),
                              "--port", str(port)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        banner = ""
        while f"http://127.0.0.1:{port}/" not in banner:
            line = board.stdout.readline()
            assert line, f"tfdist tensorboard ended: {banner}"
            banner += line
        assert "1 training run of" in banner and "1 with traces" in banner, banner
        base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 90
        while True:  # TensorBoard loads the folder once it listens
            try:
                status, runs = _get(f"{base}/data/plugin/profile/runs")
            except (urllib.error.URLError, ConnectionError):
                status, runs = 0, ""
            if (status == 200 and "worker-1" in runs) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert status == 200 and "profile/worker-0" in runs and "profile/worker-1" in runs, runs
        status, scalars = _get(f"{base}/data/plugin/scalars/tags")
        assert status == 200 and "val_accuracy" in scalars and "epoch_seconds" in scalars, scalars
        assert _get(f"{base}/data/plugin/profile/runs", {"Host": f"evil.example:{port}"})[0] == 421, "DNS rebinding"
        assert _get(f"{base}/data/plugin/profile/runs", {"Origin": "http://localhost:8888"})[0] == 403, "another page"
        served = [folder for folder in Path(tempfile.gettempdir()).glob("tfdist-tensorboard-*") if folder.is_dir()]
        assert served and all(folder.stat().st_mode & 0o077 == 0 for folder in served), "the gathered runs: 0700"
        status, why = _get(f"{base}/data/plugin/profile/capture_profile?service_addr=127.0.0.1:1&duration=10")
        assert status == 404 and "train.profile_steps" in why, "the capture is shut"
    finally:
        board.terminate()
        board.wait(timeout=30)
