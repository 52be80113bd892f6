"""Shared fixtures: prepared sample data, a tiny offline config, and one default pipeline run per session.

Helpers live in tests/helpers/ by concern (devices, project copies, servers,
reports, the browser, test hosts, Slurm); the browser fixture is in
tests/pipeline/conftest.py, beside the only tests that drive a browser.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers import devices  # noqa: F401  (splits the CPU into logical devices before any TensorFlow op)
from helpers.project import (
    LAUNCHER_TRAIN,
    REPO,
    copy_project,
    local_mode_environment,
    run_in_project,
    tiny_params,
    train_stage_command,
)

#: Files whose tests share a session fixture, by group: one worker runs a group whole, so the fixture is made once.
#: pipeline: the session's pipeline run (and browser); ray: the local launcher's run the Ray runs must match.
SHARED = {"pipeline": ("tests/pipeline/test_browser.py", "tests/pipeline/test_pipeline_e2e.py"),
          "ray": ("tests/cluster/test_ray_hosts.py", "tests/cluster/test_ray_launcher.py")}

#: The longest groups first (make test's --durations), so that the two workers of ``-n 2`` finish together.
LONGEST_FIRST = ("pipeline", "ray", "tests/test_crash_points.py", "tests/train/test_crash_points_multi_process.py",
                 "tests/train/test_crash_points_parameter_server.py",
                 "tests/train/test_resume.py", "tests/train/test_store_outage.py",
                 "tests/pipeline/test_teams.py", "tests/cluster/test_network.py",
                 "tests/cluster/test_slurm_hosts.py", "tests/cluster/test_multi_process.py")


def worker_group(nodeid: str) -> str:
    """The worker-sized unit a test runs in under ``make test``'s ``-n 2``: its file, or its group's files."""
    path = nodeid.split("::", 1)[0]
    return next((group for group, files in SHARED.items() if path in files), path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest groups first, each file in its own order (xdist hands the groups out in this order)."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(worker_group(item.nodeid), len(rank)))  # stable


@pytest.hookimpl(optionalhook=True)  # an xdist hook: the suite also runs without xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scheduler by scope, its scopes :func:`worker_group`: each runs whole on one worker.

    So a file's module fixtures are made once, and the pipeline run once. (xdist's
    own ``xdist_group`` marks did not group anything under pytest 9: each test
    went its own way, and the pipeline fixture was made on both workers.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return GroupScheduling(config, log)


@dataclass(frozen=True)
class PipelineRun:
    """A fresh clone after one default ``dvc repro``: where it is, what DVC printed, its MLflow execution tag."""

    root: Path
    output: str
    execution: str


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> PipelineRun:
    """The default pipeline (every strategy, 3 epochs on the offline sample) in a fresh clone, run once per session.

    Shared by the slow end-to-end and browser tests (the browser's screenshots are the
    README's). Tests that change the clone (``dvc exp run``, params edits) live at the end
    of test_pipeline_e2e.py and find the first execution's runs by its tag.
    """
    import mlflow

    # a target 3 epochs on the sample reach (val accuracy 0.90 after the first), so time to accuracy is measured
    root = copy_project(tmp_path_factory.mktemp("pipeline"), data={"source": "sample"}, train={"epochs": 3},
                        compare={"target_accuracy": 0.9})
    output = run_in_project(["dvc", "repro"], root)
    mlflow.set_tracking_uri(f"sqlite:///{root}/mlruns/mlflow.db")
    (execution,) = mlflow.search_runs(experiment_names=["tfdist-mnist"], output_format="list",
                                      filter_string="tags.`tfdist.role` = 'execution'")
    return PipelineRun(root, output, execution.data.tags["tfdist.execution"])


@pytest.fixture(scope="session")
def local_launcher_run(tmp_path_factory: pytest.TempPathFactory, prepared_dir: Path) -> dict[str, Any]:
    """The report of multi_worker_mirrored x2 through the local launcher (2 epochs, batch 25 on the sample), run once.

    What Ray's runs, on one machine or across test hosts, must match to the bit (the same params and data).
    """
    workdir = tmp_path_factory.mktemp("local-launcher")
    shutil.copytree(prepared_dir, workdir / "data" / "prepared")
    tiny_params(workdir, train=LAUNCHER_TRAIN)
    done = subprocess.run(train_stage_command(workdir, "multi_worker_mirrored", "local"), cwd=REPO,
                          env=local_mode_environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((workdir / "reports" / "local.json").read_text())


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    return tiny_params(tmp_path)


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample, preprocessed once per session."""
    from tfdist.config.params import load_config
    from tfdist.data.stage import preprocess

    root = tmp_path_factory.mktemp("prepared")
    config = load_config(tiny_params(root))
    preprocess(config, root / "data")
    return root / "data"


@pytest.fixture
def prepared_copy(prepared_dir: Path, tmp_path: Path) -> Path:
    """A per-test copy of the prepared data, for tests that write next to it."""
    target = tmp_path / "data" / "prepared"
    shutil.copytree(prepared_dir, target)
    return target
