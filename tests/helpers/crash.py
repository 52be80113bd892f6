"""Walking a stage through its crash points (tfdist.crash_points): killed for real at each, then let finish.

A walk kills the stage at its first point, runs it again to be killed at the next, and so on,
then runs it to the end: each rerun starts from whatever the kills before it left (a crash
while recovering from a crash included). What must hold after every kill is checked by the
caller's ``after_kill``; what must hold at the end, by the caller and :func:`debris`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow

from tfdist.crash_points import CRASH_ENV, CRASH_GROUP_ENV, crash_points_of

from helpers.project import REPO, local_mode_environment, running_stage_tasks, tiny_params

#: The pass of a point a walk kills at, where the first is not the one to test.
NTH_PASS = {"epoch.trained": 2,  # in epoch 2: epoch 1 is backed up, epoch 2 is lost
            "backup.step": 2}  # epoch 1's second backup within it (WALK_TRAIN): steps.json names the first
#: Training params of every walk: a backup within an epoch every execution of 20 steps.
WALK_TRAIN = {"backup_every": 20}
#: A training's points up to its last epoch's backup: where strategies differ. After them the chief saves,
#: logs and commits with the same code under every strategy; that code is walked where the chief is the
#: stage's first process (default) and where it is a task of its own (multi_worker_mirrored).
TRAINING_POINTS = crash_points_of("train")[:crash_points_of("train").index("backup.written") + 1]


def stage_command(stage: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"stages.{stage}", *args]


def run_stage(command: list[str], crash: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``command`` as a stage in a process group of its own (a crash kills that group), switched to die at ``crash``."""
    env = {key: value for key, value in local_mode_environment().items() if key not in (CRASH_ENV, CRASH_GROUP_ENV)}
    if crash:
        env[CRASH_ENV] = crash
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                          start_new_session=True)


def walk(stage: str, command: list[str], after_kill: Callable[[str], None] = lambda point: None,
         timeout: float = 300, said: bool = True, points: list[str] | None = None) -> list[str]:
    """Kill ``stage`` at each of its points (or ``points``) in turn, calling ``after_kill(point)``, then run it to the end.

    ``said``: the process that dies says which point killed it on the stage's own
    stderr (not so a task of a local cluster, whose launcher dies before relaying it).
    Returns every run's output (stderr, then stdout), the finishing run's last.
    """
    outputs = []
    for point in points or crash_points_of(stage):
        switch = f"{point}@{NTH_PASS[point]}" if point in NTH_PASS else point
        done = run_stage(command, switch, timeout)
        outputs.append(done.stderr + done.stdout)
        assert done.returncode == -signal.SIGKILL, (
            f"{stage} switched to die at {switch} ended with {done.returncode}:\n{outputs[-1][-3000:]}")
        assert not said or f"crash point {switch}: killing the stage" in outputs[-1], outputs[-1][-3000:]
        after_kill(point)
    done = run_stage(command, timeout=timeout)
    outputs.append(done.stderr + done.stdout)
    assert done.returncode == 0, f"{stage}'s last rerun failed:\n{outputs[-1][-3000:]}"
    return outputs


def debris(root: Path) -> list[Path]:
    """Staging folders, temporaries and lock files anywhere under ``root`` (DVC's own .dvc/tmp aside)."""
    return sorted(path for path in root.rglob("*")
                  if (path.name.endswith((".tmp", ".lock")) or path.name.startswith("tmp"))
                  and ".dvc" not in path.relative_to(root).parts)


def wait_until_gone(find: Callable[[], list[str]], timeout: float = 30.0) -> list[str]:
    """What ``find`` still lists after ``timeout`` seconds (tasks die with their launcher within moments)."""
    deadline = time.monotonic() + timeout
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def metrics_logged_twice_at_a_step(run_id: str) -> dict[str, list[int]]:
    """Every metric of run ``run_id`` logged more than once at one step, with its steps."""
    client = mlflow.MlflowClient()
    twice = {}
    for key in client.get_run(run_id).data.metrics:
        steps = [metric.step for metric in client.get_metric_history(run_id, key)]
        if len(steps) != len(set(steps)):
            twice[key] = sorted(steps)
    return twice


class Workspace:
    """A project's folders under ``root``, the stages' commands on them."""

    def __init__(self, root: Path, trainings: dict[str, str], **sections: dict):
        self.root, self.trainings = root, trainings
        root.mkdir(parents=True, exist_ok=True)
        distributed = {"strategies": ["mirrored"], **sections.pop("distributed", {})}
        train = {**WALK_TRAIN, **sections.pop("train", {})}
        self.params = tiny_params(root, distributed=distributed, train=train, **sections)
        self.prepared, self.models, self.backups = root / "data" / "prepared", root / "models", root / "backups"
        self.reports = root / "reports"

    def command(self, stage: str, *args: str) -> list[str]:
        return stage_command(stage, "--params", str(self.params), *args)

    def preprocess(self) -> list[str]:
        return self.command("preprocess", "--out", str(self.prepared), "--report", str(self.reports / "data.json"))

    def train(self, name: str) -> list[str]:
        return self.command("train", "--strategy", self.trainings[name], "--name", name, "--data", str(self.prepared),
                            "--models", str(self.models), "--reports", str(self.reports / "train"),
                            "--backups", str(self.backups))

    def evaluate(self, out: str = "eval") -> list[str]:
        return self.command("evaluate", *(arg for name in self.trainings for arg in ("--name", name)),
                            "--data", str(self.prepared), "--models", str(self.models),
                            "--train-reports", str(self.reports / "train"), "--reports", str(self.reports / out))

    def compare(self, out: str = "compare") -> list[str]:
        return self.command("compare", "--train-reports", str(self.reports / "train"),
                            "--eval-reports", str(self.reports / "eval"), "--out", str(self.reports / out))

    def track(self) -> None:
        mlflow.set_tracking_uri(f"sqlite:///{self.root}/mlruns/mlflow.db")

    def training_run(self, name: str) -> Any:
        """The one MLflow run of training ``name``: FINISHED, every epoch once, no metric twice at a step."""
        self.track()
        (run,) = mlflow.search_runs(experiment_names=["tests"], output_format="list",
                                    filter_string=f"tags.stage = 'train' and tags.model_name = '{name}'")
        assert run.info.status == "FINISHED"
        steps = [m.step for m in mlflow.MlflowClient().get_metric_history(run.info.run_id, "val_accuracy")]
        assert steps == [1, 2], "every epoch once"
        assert metrics_logged_twice_at_a_step(run.info.run_id) == {}
        return run


def walk_a_cluster(workspace: Workspace, name: str, reference: dict[str, Any] | None = None,
                   points: list[str] | None = None) -> dict[str, Any]:
    """Walk training ``name`` of a local cluster through every crash point (or ``points``); its report, checked.

    After every kill no task of the stage is left running; at the end the
    training has one FINISHED MLflow run (every epoch once, no metric twice at
    a step), no backup and nothing in the workspace. With ``reference``, the report of an uninterrupted run of the
    same training, it must end with the same weights, to the byte.
    """
    def after_kill(point: str) -> None:
        assert wait_until_gone(lambda: running_stage_tasks(workspace.root)) == [], f"tasks left after the kill at {point}"

    walk("train", workspace.train(name), after_kill, said=False, points=points)
    report = json.loads((workspace.reports / "train" / f"{name}.json").read_text())
    assert report["epochs"] == 2 and report["val_accuracy"] > 0.8
    if reference is not None:
        assert report["weights_sha256"] == reference["weights_sha256"], "resumed at every step, the same weights to the byte"
    assert workspace.training_run(name).info.run_id == report["mlflow_run_id"]
    assert not (workspace.backups / name).exists()
    assert debris(workspace.root) == [], "no staging folder, temporary or lock anywhere in the workspace"
    return report
