"""The whole pipeline as a user runs it: ``dvc repro`` in a copy of the repo."""

import json
import os
import shutil
import subprocess
import sys

import mlflow
import pytest
import yaml

from conftest import REPO

pytestmark = pytest.mark.slow
STRATEGIES = ("mirrored", "central_storage", "multi_worker_mirrored", "parameter_server")


def run(cmd, cwd):
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A copy of the repo's tracked files in a fresh git repo, with small params."""
    root = tmp_path_factory.mktemp("project")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    for stale in ("dvc.lock", "reports"):
        shutil.rmtree(root / stale, ignore_errors=True) if (root / stale).is_dir() else (root / stale).unlink(missing_ok=True)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["data"]["source"] = "sample"
    params["train"]["epochs"] = 2
    assert params["distributed"]["strategies"] == list(STRATEGIES), "the default compares every strategy"
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    run(["git", "init", "-q"], root)
    return root


def test_dvc_repro_runs_every_stage_then_is_a_no_op(project):
    output = run(["dvc", "repro"], project)
    for stage in ("preprocess", "train-normal", "evaluate-normal", "compare",
                  *(f"{kind}-distributed@{name}" for name in STRATEGIES for kind in ("train", "evaluate"))):
        assert f"Running stage '{stage}'" in output

    comparison = json.loads((project / "reports" / "compare" / "compare.json").read_text())
    assert list(comparison["runs"]) == ["normal", *sorted(STRATEGIES)]
    for name, row in comparison["runs"].items():
        assert row["test_accuracy"] > 0.8, name
    assert comparison["runs"]["multi_worker_mirrored"]["workers"] == 2
    assert comparison["runs"]["parameter_server"]["synchronous"] is False
    markdown = (project / "reports" / "compare" / "compare.md").read_text()
    assert "Distribution" in markdown and "| normal | default | fit | float32 | sync | 1 | 1 | 25 |" in markdown
    assert "**Asynchronous:** parameter_server" in markdown

    mlflow.set_tracking_uri(f"sqlite:///{project}/mlruns/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["tfdist-mnist"], output_format="list")
    assert sorted(r.info.run_name for r in runs) == sorted(["compare", "normal", *STRATEGIES])
    assert all(r.info.status == "FINISHED" for r in runs)
    assert {r.data.tags.get("dvc.stage") for r in runs} >= {"train-normal", "train-distributed@mirrored", "compare"}
    assert all("test_accuracy" in r.data.metrics for r in runs if r.info.run_name != "compare")

    assert "Data and pipelines are up to date." in run(["dvc", "repro"], project)


def test_changing_epochs_reruns_training_not_preprocessing(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["train"]["epochs"] = 1
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    status = run(["dvc", "status"], project)
    assert "train-normal" in status and "preprocess:" not in status
    output = run(["dvc", "repro"], project)
    assert "Running stage 'preprocess'" not in output
    assert "Running stage 'train-normal'" in output and "Running stage 'compare'" in output
    assert json.loads((project / "reports" / "train" / "normal.json").read_text())["epochs"] == 1
