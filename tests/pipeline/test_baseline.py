"""The committed baseline (dvc.lock and the small reports) is what the committed code and params produce.

A fresh clone compares every change against it (``dvc metrics diff``, ``dvc params diff``,
``dvc plots diff main``), so it must not fall behind dvc.yaml, params.yaml or the code.
"""

import json
import os
import subprocess
import sys

from helpers.project import REPO

#: Outputs the baseline commits (small text DVC compares); data and models stay in DVC's cache.
COMMITTED = ("dvc.lock", "reports/data.json", "reports/compare/metrics.json", "reports/compare/curves.csv",
             "reports/train/normal.json", "reports/eval/normal.json")


def dvc_status() -> dict:
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["dvc", "status", "--json"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300, check=True)
    return json.loads(result.stdout or "{}")


def stale_entries(status: dict) -> dict[str, list[str]]:
    """What makes each stage's locked result out of date: code, params, command, or a committed report edited."""
    stale: dict[str, list[str]] = {}
    for stage, changes in status.items():
        for change in changes:
            if change == "changed command":
                stale.setdefault(stage, []).append("its command")
                continue
            if not isinstance(change, dict):
                continue
            for path, what in change.get("changed deps", {}).items():
                if path.endswith(".py") or isinstance(what, dict):  # code, or params (a dict of changed keys)
                    stale.setdefault(stage, []).append(f"{path}: {what}")
            for path, what in change.get("changed outs", {}).items():
                if path.startswith("reports/") and what == "modified":
                    stale.setdefault(stage, []).append(f"{path}: {what}")
    return stale


def test_the_baseline_is_committed():
    tracked = subprocess.run(["git", "ls-files", *COMMITTED], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    assert sorted(tracked) == sorted(COMMITTED), "commit the baseline: make clean && make repro, then git add"


def test_the_committed_baseline_is_current_with_the_code_and_params():
    stale = stale_entries(dvc_status())
    assert not stale, (
        f"the committed baseline is stale: {stale}; run `make clean && make repro` and commit dvc.lock and reports/")


def test_the_check_sees_code_params_and_command_changes():
    status = {
        "train-normal": [{"changed deps": {"src/tfdist/train/fit.py": "modified", "data/prepared": "deleted"}}],
        "preprocess": [{"changed deps": {"params.yaml": {"data.validation_split": "modified"}}}],
        "compare": ["changed command", {"changed outs": {"reports/compare/metrics.json": "modified"}}],
        "evaluate-normal": [{"changed outs": {"reports/eval/normal.json": "deleted"}}],
    }
    assert stale_entries(status) == {
        "train-normal": ["src/tfdist/train/fit.py: modified"],
        "preprocess": ["params.yaml: {'data.validation_split': 'modified'}"],
        "compare": ["its command", "reports/compare/metrics.json: modified"],
    }


def test_the_baseline_trained_with_onednn_as_runtime_onednn_says():
    # dvc repro runs the stage as a process of its own: the knob must reach TensorFlow before it loads there
    # (it used not to: the mlp's 'auto: off' was not applied, and the report said oneDNN on)
    from tfdist.config.params import load_config
    from tfdist.runtime.onednn import onednn_enabled

    config = load_config(REPO / "params.yaml")
    report = json.loads((REPO / "reports" / "train" / "normal.json").read_text())
    wanted = onednn_enabled(config.runtime.onednn, config.model.kind, config.train.precision)
    assert report["threads"]["onednn"] is wanted, "rerun the pipeline (dvc repro) after changing runtime.onednn"
