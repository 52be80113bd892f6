"""Crash anywhere, across processes: multi_worker_mirrored and parameter_server walked through every crash point.

The point's process (the launcher, or a task in a session of its own) kills the stage's process
group and its own; the launcher's other tasks die with it (PR_SET_PDEATHSIG). After every kill no
task of the stage is left running; at the end the training is an uninterrupted one's (weights to
the byte under multi_worker_mirrored; parameter_server's asynchronous updates are not
reproducible, so there the run must train), with one FINISHED MLflow run, every epoch once, no
metric twice at a step, and nothing left in the workspace. tests/test_crash_points.py walks the
other stages and the single-process strategies.
"""

from __future__ import annotations

import json
import shutil

import pytest

from helpers.crash import Workspace, debris, run_stage, wait_until_gone, walk
from helpers.project import running_stage_tasks

pytestmark = pytest.mark.slow

TRAININGS = {"mwms": "multi_worker_mirrored", "ps": "parameter_server"}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, prepared_dir) -> Workspace:
    workspace = Workspace(tmp_path_factory.mktemp("crash-multi-process"), TRAININGS)
    shutil.copytree(prepared_dir, workspace.prepared)
    return workspace


@pytest.mark.parametrize("name", TRAININGS)
def test_a_multi_process_training_killed_at_each_point_leaves_no_task_and_ends_whole(workspace, name, tmp_path):
    def after_kill(point: str) -> None:
        assert wait_until_gone(lambda: running_stage_tasks(workspace.root)) == [], f"tasks left after the kill at {point}"

    walk("train", workspace.train(name), after_kill, said=False)
    report = json.loads((workspace.reports / "train" / f"{name}.json").read_text())
    assert report["epochs"] == 2 and report["val_accuracy"] > 0.8
    if name == "mwms":
        reference = Workspace(tmp_path, TRAININGS)
        shutil.copytree(workspace.prepared, reference.prepared)
        done = run_stage(reference.train(name))
        assert done.returncode == 0, done.stderr[-3000:]
        fresh = json.loads((reference.reports / "train" / f"{name}.json").read_text())
        assert report["weights_sha256"] == fresh["weights_sha256"], "resumed at every step, the same weights to the byte"
    assert workspace.training_run(name).info.run_id == report["mlflow_run_id"]
    assert not (workspace.backups / name).exists()
    assert debris(workspace.root) == [], "no staging folder, temporary or lock anywhere in the workspace"
