"""Crash anywhere, across processes: parameter_server (chief, a worker, a ps) walked through every crash point.

As tests/train/test_crash_points_multi_process.py walks multi_worker_mirrored, but its asynchronous
updates are not reproducible even uninterrupted, so the training must train, not match weights.
One worker, not the default two: one is enough to make it a cluster of every kind of task. Its
training points (helpers.crash.TRAINING_POINTS): after them its chief, the stage's first process,
saves, logs and commits as default's does, which tests/test_crash_points.py walks.
"""

from __future__ import annotations

import shutil

import pytest

from helpers.crash import TRAINING_POINTS, Workspace, walk_a_cluster

pytestmark = pytest.mark.slow


def test_a_parameter_server_training_killed_at_each_point_leaves_no_task_and_ends_whole(tmp_path, prepared_dir):
    workspace = Workspace(tmp_path, {"ps": "parameter_server"}, distributed={"workers": 1})
    shutil.copytree(prepared_dir, workspace.prepared)
    # its backups are the epochs' ends (tfdist.resume.within_epoch.StopWhenPreempted): no backup.step to pass
    report = walk_a_cluster(workspace, "ps", points=[point for point in TRAINING_POINTS if point != "backup.step"])
    assert (report["workers"], report["ps"], report["synchronous"]) == (1, 1, False)
