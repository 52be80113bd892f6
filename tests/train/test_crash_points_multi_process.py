"""Crash anywhere, across processes: multi_worker_mirrored walked through every crash point.

The point's process (the launcher, or a task in a session of its own) kills the stage's process
group and its own; the launcher's other tasks die with it (PR_SET_PDEATHSIG). After every kill no
task of the stage is left running; at the end the weights are an uninterrupted run's, to the byte,
with one FINISHED MLflow run, every epoch once, no metric twice at a step, and nothing left in the
workspace (tests/helpers/crash.py). parameter_server walks in test_crash_points_parameter_server.py
(its own file, so the two CI workers share the walks); the other stages and the single-process
strategies in tests/test_crash_points.py.
"""

from __future__ import annotations

import shutil

import pytest

from helpers.crash import Workspace, walk_a_cluster
from helpers.project import LAUNCHER_TRAIN

pytestmark = pytest.mark.slow


def test_a_multi_worker_mirrored_training_killed_at_each_point_ends_with_an_uninterrupted_one_s_weights(
        tmp_path, prepared_dir, local_launcher_run):
    workspace = Workspace(tmp_path / "walked", {"mwms": "multi_worker_mirrored"}, train=LAUNCHER_TRAIN)
    shutil.copytree(prepared_dir, workspace.prepared)
    walk_a_cluster(workspace, "mwms", reference=local_launcher_run)  # local_launcher_run: the same training
