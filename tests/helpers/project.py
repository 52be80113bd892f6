"""A project copy to run in, and the train stage as a subprocess: what the end-to-end and process tests share."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from helpers.devices import LOGICAL_CPUS

REPO = Path(__file__).resolve().parents[2]


def process_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def running_stage_tasks(workdir: Path) -> list[str]:
    """Train stage processes of this test (their paths are under ``workdir``) still running on any host."""
    found = subprocess.run(["pgrep", "-af", "stages.train"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in found if str(workdir) in line]


def stage_paths(workdir: Path) -> list[str]:
    """The train stage's path options (params, data, outputs, backups under ``workdir``): what an sbatch example
    passes on to the stage."""
    options = train_stage_command(workdir, "default")[3:]  # past python -m stages.train
    flags = ("--strategy", "--name")
    return [arg for i, arg in enumerate(options) if arg not in flags and (i == 0 or options[i - 1] not in flags)]


def train_stage_command(workdir: Path, strategy: str, name: str | None = None, *sets: str) -> list[str]:
    """The train stage as a subprocess command, every path (params, data, outputs, backups) under ``workdir``."""
    from stages.train import run_command

    return run_command(workdir / "params.yaml", sets, strategy=strategy, name=name or strategy,
                       data=workdir / "data" / "prepared", models=workdir / "models", reports=workdir / "reports",
                       backups=workdir / "backups")


def copy_project(root: Path, **sections: dict) -> Path:
    """The repo's tracked files copied into ``root`` as a fresh git repo with one commit, params updated.

    What a user gets from ``git clone``: no dvc.lock, no reports, no store.
    ``sections`` update params.yaml (e.g. ``train={"epochs": 2}``).
    """
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file() and not name.startswith(("reports/", "dvc.lock")):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    template = REPO / "vega" / "offline.html"  # built by make install, not tracked
    if template.is_file():
        shutil.copy2(template, root / "vega" / "offline.html")
    params = yaml.safe_load((root / "params.yaml").read_text())
    for key, value in sections.items():
        params[key] = {**params[key], **value} if isinstance(value, dict) else value
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    git = ["git", "-c", "user.name=tfdist tests", "-c", "user.email=tests@tfdist.invalid"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy of the repo"]):
        subprocess.run([*git, *command], cwd=root, check=True, capture_output=True)
    return root


def run_in_project(command: list[str], cwd: Path, timeout: float = 900) -> str:
    """Run ``command`` in a project copy with this venv first on PATH; fail the test with its output if it fails."""
    env = {**local_mode_environment(), "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def local_mode_environment() -> dict[str, str]:
    """This environment without TF_CONFIG, so multi-process strategies launch locally."""
    return {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}


#: The training of conftest's local_launcher_run, which the Ray runs repeat to compare weights bit for bit.
LAUNCHER_TRAIN = {"epochs": 2, "batch_size": 25}


def tiny_params(tmp_path: Path, **sections: dict) -> Path:
    """Write a params.yaml for fast offline tests (sample data, 2 epochs, temp MLflow store)."""
    params = {
        "seed": 7,
        "data": {"source": "sample", "validation_split": 0.1, "test_split": 0.2},
        "train": {"epochs": 2, "batch_size": 32, "steps_per_execution": 20},
        "distributed": {"strategies": ["mirrored"], "devices": LOGICAL_CPUS},
        "mlflow": {"tracking_uri": f"sqlite:///{tmp_path}/mlruns/mlflow.db", "experiment": "tests", "log_models": False},
    }
    for key, value in sections.items():
        params[key] = {**params.get(key, {}), **value}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


