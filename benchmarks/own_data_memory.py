"""Benchmark: peak memory of preprocess and of a training on a 60,000-image 32x32x3 set of the user's own.

The set (an .npz of uint8 images, 3 classes, made once from ``colour``
stripes and noise) is 184 MB as bytes and would be 737 MB as float32. The
preprocess stage checks it and writes it as uint8; a train stage (normal
training, 1 epoch) reads it as uint8 and scales each batch as it goes. Each is
a process of its own, whose peak resident memory (``ru_maxrss`` from
``wait4``) is what it held at most, TensorFlow's own included.

    python -m benchmarks own_data_memory [--models mlp cnn] [--rounds 3]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Options
from benchmarks.results import Result, spread
from stages.train import run_command

TITLE = "Peak memory (MB) of preprocess and of normal training on a 60,000-image 32x32x3 set"
DEFAULTS = {"models": ["mlp", "cnn"], "batches": [256], "epochs": 1}
IMAGES, SIZE, CLASSES = 60_000, 32, 3


def cells(options: Options) -> list[dict[str, Any]]:
    return [{"stage": "preprocess"}, *({"stage": "train", "model": model} for model in options.models)]


def setup(options: Options) -> Path:
    """A scratch project: the set as data/sources/parts.npz, and a params file pointing at it."""
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-memory-"))
    rng = np.random.default_rng(0)
    labels = np.arange(IMAGES) % CLASSES
    images = rng.integers(0, 60, (IMAGES, SIZE, SIZE, 3), dtype=np.uint8)
    for label in range(CLASSES):
        images[labels == label, :, :, label] += 150
    np.savez(root / "parts.npz", x=images, y=labels)
    del images
    params = root / "params.yaml"
    params.write_text(Path("params.yaml").read_text())
    return root


def _peak(command: list[str]) -> tuple[float, float]:
    """Run ``command``; its peak resident memory in MB and its wall seconds."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{command[1]} exited {os.waitstatus_to_exitcode(status)}:\n{process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
    return usage.ru_maxrss / 1024, seconds


def measure(cell: dict[str, Any], root: Path, options: Options) -> dict[str, float]:
    overrides = [f"data.source={root / 'parts.npz'}", f"mlflow.tracking_uri=sqlite:///{root}/mlflow.db",
                 "mlflow.log_models=false"]
    sets = ["--params", str(root / "params.yaml"), *(arg for item in overrides for arg in ("--set", item))]
    if cell["stage"] == "preprocess":
        peak, seconds = _peak([sys.executable, "stages/preprocess.py", *sets, "--out", str(root / "prepared"),
                               "--report", str(root / "data.json")])
    else:
        if not (root / "prepared").is_dir():
            _peak([sys.executable, "stages/preprocess.py", *sets, "--out", str(root / "prepared"),
                   "--report", str(root / "data.json")])
        peak, seconds = _peak(run_command(
            root / "params.yaml", [*overrides, f"model.kind={cell['model']}", f"train.epochs={options.epochs}",
                                   f"train.batch_size={options.batches[0]}"],
            strategy="default", name=f"{cell['model']}-{time.monotonic_ns()}", data=root / "prepared",
            models=root / "models", reports=root / "reports", backups=root / "backups"))
    return {"peak_mb": peak, "seconds": seconds}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """A row per stage (and model): its peak memory and wall time, medians and ranges."""
    rows = []
    for cell in result.cells:
        what = cell.params["stage"] + (f", {cell.params['model']}" if "model" in cell.params else "")
        rows.append([what, spread(cell.values("peak_mb"), 0), spread(cell.values("seconds"), 1)])
    return ["stage", "peak memory (MB)", "seconds"], rows
