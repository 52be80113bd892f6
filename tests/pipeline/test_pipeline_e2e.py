"""The whole pipeline as a user runs it: ``dvc repro``, ``dvc exp run``, ``dvc plots`` in a copy of the repo."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import pytest
import yaml

from helpers.browser import draw_offline
from helpers.digits import colour_set
from helpers.project import REPO, local_mode_environment, run_in_project
from helpers.reports import default_labels
from helpers.s3 import s3_store

pytestmark = pytest.mark.slow
STRATEGIES = ("mirrored", "central_storage", "multi_worker_mirrored", "parameter_server")
LABELS = default_labels()


@pytest.fixture(scope="module")
def project(pipeline):
    """The shared clone after its default ``dvc repro`` (conftest.pipeline)."""
    return pipeline.root


def runs_of(project, execution=None):
    mlflow.set_tracking_uri(f"sqlite:///{project}/mlruns/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["tfdist-mnist"], output_format="list")
    return [r for r in runs if execution is None or r.data.tags.get("tfdist.execution") == execution]


def test_dvc_repro_runs_every_stage_then_is_a_no_op(project, pipeline):
    assert yaml.safe_load((project / "params.yaml").read_text())["distributed"]["strategies"] == list(STRATEGIES)
    output = pipeline.output
    assert "absl::InitializeLog" not in output and "cudart_stub" not in output, "no TensorFlow chatter in a copy's stages"
    for stage in ("preprocess", "train-normal", "evaluate", "compare", *(f"train-distributed@{name}" for name in STRATEGIES)):
        assert f"Running stage '{stage}'" in output
    assert sorted(p.stem for p in (project / "reports" / "eval").glob("*.json")) == sorted(["normal", *STRATEGIES])

    comparison = json.loads((project / "reports" / "compare" / "compare.json").read_text())
    assert list(comparison["runs"]) == ["normal", *sorted(STRATEGIES)]
    for name, row in comparison["runs"].items():
        assert row["evaluation"]["accuracy"] > 0.8, name
    assert comparison["runs"]["multi_worker_mirrored"]["report"]["workers"] == 2
    assert comparison["runs"]["parameter_server"]["report"]["synchronous"] is False
    markdown = (project / "reports" / "compare" / "compare.md").read_text()
    assert markdown.split("\n\n")[1].startswith(("Distribution paid off", "Distribution did not pay off", "Within noise"))
    assert "| normal | default | fit | float32 | sync | 1 | " in markdown
    mwms = next(line for line in markdown.splitlines() if line.startswith("| multi_worker_mirrored | multi_worker_mirrored |"))
    assert mwms.endswith("| 2 | 2 x 1 CPU, 1 thread per op, oneDNN off |"), "each local worker is pinned to a core of its own"
    assert "**Asynchronous:** parameter_server" in markdown and "## Advice" in markdown
    assert (project / "reports" / "compare" / "compare.html").read_text().count("data:image/png;base64,") == 5
    assert "Data and pipelines are up to date." in run_in_project(["dvc", "repro"], project)


def test_one_repro_is_one_execution_in_mlflow_with_named_runs_data_and_links(project):
    runs = runs_of(project)
    assert all(r.info.status == "FINISHED" for r in runs)
    executions = {r.data.tags["tfdist.execution"] for r in runs}
    assert len(executions) == 1, f"one dvc repro must share one grouping tag, got {executions}"
    (parent,) = [r for r in runs if r.data.tags.get("tfdist.role") == "execution"]
    train_runs = {r.data.tags["model_name"]: r for r in runs if r.data.tags.get("stage") == "train"}
    assert len(runs) == 1 + len(train_runs), "the execution's parent run and one run per training, nothing else"
    assert {name: r.info.run_name for name, r in train_runs.items()} == LABELS
    assert {r.data.tags.get("dvc.stage") for r in train_runs.values()} >= {"train-normal", "train-distributed@mirrored"}
    assert {r.data.tags["mlflow.parentRunId"] for r in train_runs.values()} == {parent.info.run_id}

    data_sha256 = json.loads((project / "reports" / "data.json").read_text())["sha256"]
    for run in train_runs.values():
        assert "test_accuracy" in run.data.metrics and "system/cpu_utilization_percentage" in run.data.metrics
        (dataset_input,) = run.inputs.dataset_inputs
        assert dataset_input.dataset.digest == data_sha256[:16]
        assert {t.key: t.value for t in dataset_input.tags}["sha256"] == data_sha256
        history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "val_accuracy")
        assert [m.step for m in history] == [1, 2, 3], "per-epoch metrics carry their epoch as step"
    comparison = json.loads((project / "reports" / "compare" / "compare.json").read_text())["runs"]
    normal = comparison["normal"]
    assert normal["target_accuracy"] == 0.9 and normal["epochs_to_target"] in (1, 2, 3)
    assert train_runs["normal"].data.metrics["seconds_to_target_accuracy"] == pytest.approx(normal["seconds_to_target"])
    assert train_runs["normal"].data.metrics["time_to_accuracy_speedup"] == pytest.approx(1.0)
    headline = json.loads((project / "reports" / "compare" / "metrics.json").read_text())["normal"]
    assert headline["seconds_to_target"] == pytest.approx(normal["seconds_to_target"], abs=1e-4), "dvc exp show lists it"

    assert parent.data.tags["compared"] == ",".join(["normal", *sorted(STRATEGIES)])
    # the best speed-up's interval where the fastest run is a distributed one (normal training has none: it is 1.0)
    assert {"best_speedup", "best_test_accuracy", "runs_compared"} <= set(parent.data.metrics) <= {
        "best_speedup", "best_test_accuracy", "runs_compared", "best_speedup_low", "best_speedup_high"}
    note = parent.data.tags["mlflow.note.content"]
    for name, run in train_runs.items():
        assert f"[{LABELS[name]}](#/experiments/{run.info.experiment_id}/runs/{run.info.run_id})" in note


def test_dvc_plots_show_renders_every_run_confusion_and_figures(project):
    run_in_project(["dvc", "plots", "show", "-o", "plots"], project)
    page = (project / "plots" / "index.html").read_text()
    for title in ("Time to accuracy (validation accuracy against training seconds)", "Validation accuracy per epoch",
                  "Training loss per epoch", "Confusion matrix on the test split"):
        assert title in page
    for name in LABELS:
        assert f'"run": "{name}"' in page, f"{name}'s curve is missing"
    assert sorted(p.name for p in (project / "plots" / "static").glob("*.png")) == [
        "workspace_reports_compare_figures_accuracy_vs_time.png", "workspace_reports_compare_figures_loss_curves.png",
        "workspace_reports_compare_figures_projection.png", "workspace_reports_compare_figures_throughput.png",
        "workspace_reports_compare_figures_time_to_accuracy.png"]


def test_a_teammate_pulls_what_was_pushed_to_the_s3_remote_and_repro_is_a_no_op(project, tmp_path, monkeypatch):
    """make push from one clone, make pull into a fresh clone of it: nothing trains, diffs and plots work."""
    with s3_store(tmp_path / "s3") as s3:
        for key, value in s3.env.items():
            monkeypatch.setenv(key, value)  # the keys reach DVC and the check through the environment only
        first = tmp_path / "first"
        local = {"mlruns", ".tfdist", "plots"}  # the store, backups, a plots page: the workspace's own, not results
        shutil.copytree(project, first, symlinks=True,
                        ignore=lambda folder, names: [n for n in names if folder == str(project) and n in local])
        git = ["git", "-c", "user.name=tfdist tests", "-c", "user.email=tests@tfdist.invalid"]
        run_in_project([*git, "add", "-A"], first)
        run_in_project([*git, "commit", "-q", "-m", "the default pipeline's results"], first)
        run_in_project(["dvc", "remote", "modify", "--local", "team", "endpointurl", s3.endpoint], first)
        pushed = run_in_project([sys.executable, "-m", "tfdist_cli", "push"], first)
        assert "pushed" in pushed and any(key.startswith("dvc/files/md5/") for key in s3.keys("dvc/")), pushed

        second = tmp_path / "second"
        run_in_project(["git", "clone", "-q", str(first), str(second)], tmp_path)
        run_in_project(["dvc", "remote", "modify", "--local", "team", "endpointurl", s3.endpoint], second)
        run_in_project([sys.executable, "-m", "tfdist_cli", "pull"], second)
        assert (second / "models" / "normal" / "MLmodel").is_file() and (second / "data" / "prepared").is_dir()
        repro = run_in_project(["dvc", "repro"], second)
        assert "Running stage" not in repro and "Data and pipelines are up to date" in repro, repro
        assert run_in_project([sys.executable, "-m", "tfdist_cli", "status"], second).strip().endswith(
            "Cache and remote 'team' are in sync.")

        # another writer to the bucket swaps the model's MLmodel: a third teammate's pull refuses it
        digest = hashlib.md5((first / "models" / "normal" / "MLmodel").read_bytes()).hexdigest()
        s3.client().put_object(Bucket="tfdist", Key=f"dvc/files/md5/{digest[:2]}/{digest[2:]}", Body=b"planted")
        third = tmp_path / "third"
        run_in_project(["git", "clone", "-q", str(first), str(third)], tmp_path)
        run_in_project(["dvc", "remote", "modify", "--local", "team", "endpointurl", s3.endpoint], third)
        tampered = subprocess.run([sys.executable, "-m", "tfdist_cli", "pull"], cwd=third, capture_output=True,
                                  text=True, timeout=600)
        assert tampered.returncode != 0, tampered.stdout + tampered.stderr
        pulled = third / "models" / "normal" / "MLmodel"
        assert not pulled.exists() or b"planted" not in pulled.read_bytes()
    diff = run_in_project(["dvc", "metrics", "diff", "HEAD", "--all"], second)
    assert "test_accuracy" in diff, diff
    shutil.copy2(REPO / "vega" / "offline.html", second / "vega")  # what make install builds in a fresh clone
    run_in_project([sys.executable, "-m", "tfdist_cli", "plots", "diff", "HEAD", "-o", "plots"], second)
    assert "Validation accuracy per epoch" in (second / "plots" / "index.html").read_text()


def test_changing_epochs_reruns_training_not_preprocessing(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["train"]["epochs"] = 1
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    status = run_in_project(["dvc", "status"], project)
    assert "preprocess:" not in status
    for stage in ("train-normal", *(f"train-distributed@{name}" for name in STRATEGIES)):
        assert f"{stage}:" in status, f"{stage} must rerun for train.epochs:\n{status}"
    # the experiment below reruns them at this 1 epoch, and not preprocessing (a repro here cost CI 22 s more)


def test_all_three_kinds_of_distribution_in_one_experiment_then_exp_show_and_plots_diff(project, browser):
    """Data, model and pipeline parallelism side by side, as the README shows: one dvc exp run with overrides.

    Then what a user does with an experiment: ``dvc exp show`` lists its params and
    headline metrics, ``make experiments`` its table, ``dvc plots diff`` draws it
    against the committed results, offline.
    """
    run_in_project(["git", "add", "-A"], project)
    run_in_project(["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "-q", "-m", "baseline"], project)
    output = run_in_project(["dvc", "exp", "run", "-n", "paradigms", "-S", "train.loop=custom", "-S",
                             "distributed.strategies=[mirrored,model_parallel,pipeline_parallel]"], project)
    assert "Running stage 'preprocess'" not in output and "Running stage 'compare'" in output
    assert "Running stage 'train-distributed@pipeline_parallel'" in output and "Running stage 'train-normal'" in output
    assert json.loads((project / "reports" / "train" / "normal.json").read_text())["epochs"] == 1, "the edited params"
    comparison = json.loads((project / "reports" / "compare" / "compare.json").read_text())
    paradigms = {"normal": "none", "mirrored": "data", "model_parallel": "model", "pipeline_parallel": "pipeline"}
    assert {name: row["report"]["paradigm"] for name, row in comparison["runs"].items()} == paradigms
    pipeline = comparison["runs"]["pipeline_parallel"]["report"]
    assert pipeline["micro_batches"] == 5 and pipeline["bubble_theory"] == pytest.approx(1 / 6)
    assert comparison["runs"]["pipeline_parallel"]["evaluation"]["accuracy"] > 0.8 and 0 <= pipeline["bubble"] <= 1
    markdown = (project / "reports" / "compare" / "compare.md").read_text()
    assert "## What each kind of distribution holds and moves" in markdown
    assert "| pipeline_parallel | pipeline | 100,480 | 25,600 | 5 |" in markdown
    assert "**Data, model or pipeline parallelism:**" in markdown and "pipeline_parallel held at most" in markdown
    runs = runs_of(project, execution="paradigms")
    assert sorted(r.data.tags.get("model_name", "execution") for r in runs) == sorted(["execution", *paradigms])
    assert all(r.data.params.get("train.loop", "custom") == "custom" for r in runs)
    assert runs_of(project)[0].data.tags["tfdist.execution"] == "paradigms"
    by_model = {r.data.tags.get("model_name"): r for r in runs}
    assert by_model["pipeline_parallel"].data.metrics["bubble_theory"] == pytest.approx(1 / 6)
    assert by_model["model_parallel"].data.tags["strategy"] == "model_parallel"

    table = json.loads(run_in_project(["dvc", "exp", "show", "--json"], project))
    experiment = next(exp for row in table for exp in (row.get("experiments") or []) if exp["name"] == "paradigms")
    data = experiment["revs"][0]["data"]
    metrics = data["metrics"]["reports/compare/metrics.json"]["data"]
    assert set(metrics) == set(paradigms)
    headline = {"samples_per_second", "speedup", "throughput_speedup", "test_accuracy", "seconds_to_target",
                "time_to_accuracy_speedup"}
    assert {"samples_per_second", "speedup", "test_accuracy"} <= set(metrics["normal"]) <= headline
    assert set(metrics["mirrored"]) <= headline | {f"{key}_{end}" for key in headline for end in ("low", "high")}
    assert data["params"]["params.yaml"]["data"]["train"]["loop"] == "custom"

    header = run_in_project([sys.executable, "-m", "tfdist_cli", "experiments", "--csv"], project).splitlines()[0].split(",")
    assert {"train.epochs", "train.loop", "runtime.intra_op_threads", "normal.test_accuracy"} <= set(header)
    hidden = [column for column in header if column.startswith("mlflow.") or "/" in column]
    assert not hidden and "distributed.max_restarts" not in header, "make experiments hides what decides no result"

    run_in_project(["dvc", "plots", "diff", "HEAD", "paradigms", "-o", "diff"], project)
    page = (project / "diff" / "index.html").read_text()
    assert '"rev": "HEAD"' in page and '"rev": "paradigms"' in page
    drawn = draw_offline(browser, project / "diff" / "index.html", screenshot="dvc-plots-diff.png")
    assert (drawn.requests, drawn.errors) == ([], []) and drawn.plots >= 5 + len(paradigms), "every plot draws offline"


def test_the_convnet_runs_end_to_end_from_one_dvc_exp_run(project):
    """`dvc exp run -S model.kind=cnn`, as the README shows: Keras's simple MNIST convnet, normal and across workers."""
    output = run_in_project(["dvc", "exp", "run", "-n", "convnet", "-S", "model.kind=cnn", "-S",
                             "distributed.strategies=[multi_worker_mirrored]"], project)
    assert "Running stage 'preprocess'" not in output and "Running stage 'train-normal'" in output
    comparison = json.loads((project / "reports" / "compare" / "compare.json").read_text())
    assert sorted(comparison["runs"]) == ["multi_worker_mirrored", "normal"]
    for name, row in comparison["runs"].items():
        report = json.loads((project / "reports" / "train" / f"{name}.json").read_text())
        assert report["params_per_device"][0] == 34_826, "the convnet's parameters on each replica"
        assert row["evaluation"]["accuracy"] > 0.8, name
    assert comparison["scaling"][0]["gradient_bytes"] == 4 * 34_826
    runs = {r.data.tags.get("model_name"): r for r in runs_of(project, execution="convnet")}
    assert runs["normal"].data.params["model.kind"] == "cnn"
    assert [p.name for p in (project / "repeats").iterdir()] == ["repeats.json"], \
        "compare.repeats: 1, the default: the repeat stage trains nothing"


def decision(row: dict) -> str:
    """above / below / within, as the verdict decides (its interval, else 10 % of 1.0)."""
    low, high = row["vs_normal_low"].get("speedup"), row["vs_normal_high"].get("speedup")
    low, high = (low, high) if low is not None else (row["vs_normal"]["speedup"] / 1.1, row["vs_normal"]["speedup"] / 0.9)
    return "above" if low > 1 else "below" if high < 1 else "within"


def stage_pids(name: str, cwd: Path) -> list[int]:
    """The train stage processes of run ``name`` working in ``cwd`` (a launcher and its tasks)."""
    found = subprocess.run(["pgrep", "-af", "stages.train"], capture_output=True, text=True).stdout.splitlines()
    pids = [int(line.split()[0]) for line in found if f" --name {name} " in f"{line} "]
    return [pid for pid in pids if Path(f"/proc/{pid}/cwd").resolve() == cwd.resolve()]


def run_until(process: subprocess.Popen, name: str, cwd: Path, timeout: float = 600) -> list[int]:
    """Wait (bounded) until run ``name``'s stage starts; its pids."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if pids := stage_pids(name, cwd):
            return pids
        time.sleep(0.2)
    raise AssertionError(f"{name} never started:\n{process.communicate(timeout=60)[0][-3000:]}")


def test_repeats_interleave_every_training_and_a_killed_repeat_leaves_only_the_rest_to_train(project):
    """`dvc exp run -S compare.repeats=2` on the convnet's experiment: normal and multi_worker_mirrored, round 2.

    Real faults: multi_worker_mirrored.r2 is killed (SIGKILL) as it starts, and the
    rerun (`dvc repro`, as the error says: `dvc exp run` would first restore the
    experiment's starting outputs) trains only what is left, beside a CPU hog that
    gets its round flagged.
    """
    single = json.loads((project / "reports" / "compare" / "compare.json").read_text())["runs"]["multi_worker_mirrored"]
    mlflow.set_tracking_uri(f"sqlite:///{project}/mlruns/mlflow.db")
    (convnet,) = [r for r in runs_of(project, execution="convnet") if r.data.tags.get("model_name") == "normal"]
    env = {**local_mode_environment(), "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    command = ["dvc", "exp", "run", "-n", "repeats", "-S", "compare.repeats=2"]
    killed = subprocess.Popen(command, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for pid in run_until(killed, "multi_worker_mirrored.r2", project):
        os.kill(pid, signal.SIGKILL)
    output = killed.communicate(timeout=600)[0]
    assert killed.returncode != 0, output[-3000:]
    assert "error: repeat multi_worker_mirrored.r2 failed: task multi_worker_mirrored.r2 (pid " in output
    assert "was killed by SIGKILL" in output and "1 finished repeat(s) kept; run the stage again to train the 1 left" \
        in output
    assert [p.name for p in (project / "repeats" / "reports").glob("*.json")] == ["normal.r2.json"]

    rerun = subprocess.Popen(["dvc", "repro"], cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    run_until(rerun, "multi_worker_mirrored.r2", project)
    hog = int(subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True).stdout)
    try:
        output = rerun.communicate(timeout=600)[0]
    finally:
        os.kill(hog, signal.SIGKILL)
    assert rerun.returncode == 0, output[-3000:]
    assert "kept 1 finished repeat(s), made beside the same round-1 runs: normal.r2" in output, output[-3000:]
    assert "Running stage 'train-normal'" not in output and "Running stage 'evaluate'" not in output, \
        "a changed repeat count reruns the repeats and the comparison, nothing else"
    assert "Data and pipelines are up to date." in run_in_project(["dvc", "status"], project)

    names = ("normal", "multi_worker_mirrored")
    runs = [r for r in mlflow.search_runs(experiment_names=["tfdist-mnist"], output_format="list",
                                          order_by=["attributes.start_time ASC"])
            if r.data.tags.get("model_name", "").partition(".r")[0] in names and r.info.start_time >= convnet.info.start_time]
    assert [r.data.tags["model_name"] for r in runs] == [
        "normal", "multi_worker_mirrored", "normal.r2", "multi_worker_mirrored.r2"], \
        "interleaved, round after round, one MLflow run each"
    assert all(r.info.status == "FINISHED" for r in runs)

    comparison = json.loads((project / "reports" / "compare" / "compare.json").read_text())
    row = comparison["runs"]["multi_worker_mirrored"]
    assert len(row["rounds"]) == 2 and row["interval_basis"] == "2 interleaved repeats of each"
    assert [r["name"] for r in row["rounds"]] == ["multi_worker_mirrored", "multi_worker_mirrored.r2"], \
        "every round's report kept"
    assert row["rounds"][1]["machine"]["others_percent"] >= 10 and "round 2: other programs used" in \
        comparison["verdict"], "the round the hog ran beside is flagged, and the verdict says it rests on it"
    assert {decision(single), decision(row)} != {"above", "below"}, "never opposite confident verdicts"


def test_the_users_own_images_through_every_stage_named_by_their_classes(project):
    """`dvc exp run -S data.source=data/sources/parts.npz`: colour images of 3 named classes, a builder's model,
    normal and under multi_worker_mirrored (every kind under mirrored: tests/train/test_own_data_kinds.py); the
    data's files are preprocess's dependency."""
    x, y = colour_set(450, classes=3)
    np.savez(project / "data" / "sources" / "parts.npz", x=x, y=y, class_names=np.array(["bolt", "nut", "gear"]))
    output = run_in_project(["dvc", "exp", "run", "-n", "own-data", "-S", "data.source=data/sources/parts.npz",
                             "-S", "model.kind=builder", "-S", "model.builder=user_models.lenet:build",
                             "-S", "compare.repeats=1", "-S", "distributed.strategies=[multi_worker_mirrored]"],
                            project)
    assert "Running stage 'preprocess'" in output and "Running stage 'compare'" in output
    data = json.loads((project / "reports" / "data.json").read_text())
    assert (data["source"], data["shape"], data["class_names"]) == ("parts", [16, 16, 3], ["bolt", "nut", "gear"])
    comparison = json.loads((project / "reports" / "compare" / "compare.json").read_text())
    assert sorted(comparison["runs"]) == ["multi_worker_mirrored", "normal"]
    for name, row in comparison["runs"].items():
        assert row["report"]["dataset"] == "parts (16x16x3, 3 classes)", name
        assert set(row["evaluation"]["per_class"]) == {"bolt", "nut", "gear"}, name
    assert "training on parts (16x16x3, 3 classes)" in (project / "reports" / "compare" / "compare.md").read_text()
    confusion = (project / "reports" / "eval" / "confusion" / "multi_worker_mirrored.csv").read_text().splitlines()
    assert confusion[0] == "actual,predicted" and {row.split(",")[0] for row in confusion[1:]} == {"bolt", "nut", "gear"}
    runs = {r.data.tags.get("model_name"): r for r in runs_of(project, execution="own-data")}
    assert runs["multi_worker_mirrored"].inputs.dataset_inputs[0].dataset.name == "parts"
    (project / "data" / "sources" / "notes.txt").write_text("a file beside the data changes preprocess's dependency\n")
    assert "preprocess:" in run_in_project(["dvc", "status"], project)
