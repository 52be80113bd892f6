"""Benchmark: normal training's throughput at other commits and at this one, side by side on one machine.

Each commit (``--set commits=[a48c729, ...]``; ``HEAD`` is the working commit) is
exported (``git archive``) into a scratch folder with its own stages and library;
its own preprocess stage prepares the same 60,000 MNIST-format images
(:func:`benchmarks.common.full_size_mnist`) in its own format, once; then each
round runs every commit's train stage (normal training, the mlp, ``--epochs``
epochs at batch 25, models not logged) in a process of its own, the commits
alternating, and reads its train report: samples per second over the whole
training and at steady state (the epochs after the first).

    python -m benchmarks commits [--rounds 5] [--epochs 3] [--set commits=[a48c729,HEAD]]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import full_size_mnist
from benchmarks.harness import Options
from benchmarks.results import Result, spread

TITLE = "normal training's samples per second at other commits and this one (60,000 images, batch 25, mlp)"
DEFAULTS = {"models": ["mlp"], "batches": [25], "epochs": 3, "rounds": 5,
            "extra": {"commits": ["a48c729", "09a3ffb", "HEAD"]}}


def cells(options: Options) -> list[dict[str, Any]]:
    return [{"commit": _resolve(commit)} for commit in options.extra.get("commits", DEFAULTS["extra"]["commits"])]


def _resolve(commit: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short=10", commit], capture_output=True, text=True, check=True
                          ).stdout.strip()


def setup(options: Options) -> Path:
    """A scratch folder: each commit exported, with its own prepared data of the same images."""
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-commits-"))
    source = full_size_mnist().resolve()
    for cell in cells(options):
        folder = root / cell["commit"]
        folder.mkdir()
        archive = subprocess.run(["git", "archive", cell["commit"]], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
        _stage(folder, ["stages/preprocess.py", *_sets(folder, source, options), "--out", "prepared",
                        "--report", "data.json"])
    return root


def teardown(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


def _sets(folder: Path, source: Path, options: Options) -> list[str]:
    overrides = [f"data.source={source}", f"mlflow.tracking_uri=sqlite:///{folder}/mlflow.db",
                 "mlflow.log_models=false", f"train.epochs={options.epochs}", f"train.batch_size={options.batches[0]}",
                 f"model.kind={options.models[0]}"]
    return ["--params", "params.yaml", *(arg for item in overrides for arg in ("--set", item))]


def _stage(folder: Path, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": f"{folder / 'src'}:{folder}", "MLFLOW_TRACKING_URI": ""}
    done = subprocess.run([sys.executable, *args], cwd=folder, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{folder.name}: {' '.join(args[:1])} exited {done.returncode}:\n{done.stderr[-2000:]}")


def measure(cell: dict[str, Any], root: Path, options: Options) -> dict[str, float]:
    folder = root / cell["commit"]
    name = f"run{time.monotonic_ns()}"
    _stage(folder, ["stages/train.py", *_sets(folder, full_size_mnist().resolve(), options), "--strategy", "default",
                    "--name", name, "--data", "prepared", "--models", "models", "--reports", "reports",
                    "--backups", "backups"])
    report = json.loads((folder / "reports" / f"{name}.json").read_text())
    shutil.rmtree(folder / "models" / name, ignore_errors=True)
    return {"samples_per_second": report["samples_per_second"],
            "steady_samples_per_second": report["steady_samples_per_second"]}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """A row per commit: samples per second, whole training and steady state, medians and ranges."""
    rows = [[cell.params["commit"], spread(cell.values("samples_per_second"), 0),
             spread(cell.values("steady_samples_per_second"), 0)] for cell in result.cells]
    return ["commit", "samples/s (all epochs)", "samples/s (steady)"], rows
