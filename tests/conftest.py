"""Shared fixtures: prepared sample data, a tiny offline config, and one default pipeline run per session.

Helpers live in tests/helpers/ by concern (devices, project copies, servers,
reports, the browser, test hosts, Slurm); the browser fixture is in
tests/pipeline/conftest.py, beside the only tests that drive a browser.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import devices  # noqa: F401  (splits the CPU into logical devices before any TensorFlow op)
from helpers.project import copy_project, run_in_project, tiny_params


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

    root = copy_project(tmp_path_factory.mktemp("pipeline"), data={"source": "sample"}, train={"epochs": 3})
    output = run_in_project(["dvc", "repro"], root)
    mlflow.set_tracking_uri(f"sqlite:///{root}/mlruns/mlflow.db")
    (execution,) = mlflow.search_runs(experiment_names=["tfdist-mnist"], output_format="list",
                                      filter_string="tags.`tfdist.role` = 'execution'")
    return PipelineRun(root, output, execution.data.tags["tfdist.execution"])


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    return tiny_params(tmp_path)


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample, preprocessed once per session."""
    from tfdist.config import load_config
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
