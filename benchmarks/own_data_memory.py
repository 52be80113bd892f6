"""Benchmark: every stage's peak memory on a set of the user's own, at 1x and 10x the images (flat as data grows?).

The sets (uncompressed ``.npz`` files of uint8 32x32x3 colour images, 3 classes,
written a chunk at a time) are 60,000 images (184 MB) and 600,000 (1.84 GB).
For each, the preprocess stage prepares it, normal training (the mlp, 1 epoch
at batch 256) and multi_worker_mirrored (2 local workers) train on it, and the
evaluate stage evaluates both models. Each stage is a process tree of its own;
``wait4``'s ``ru_maxrss`` is the peak resident memory of its largest process
(the launcher's workers included: a reaped child's peak passes to its parent),
TensorFlow's own included.

    python -m benchmarks own_data_memory [--rounds 3] [--set scales=[1,10]]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Options
from benchmarks.results import Result, spread
from stages.train import run_command

TITLE = "Peak memory (MB) of every stage on 60,000 and 600,000 32x32x3 images of the user's own"
DEFAULTS = {"models": ["mlp"], "batches": [256], "epochs": 1, "extra": {"scales": [1, 10]}}
IMAGES, SIZE, CLASSES = 60_000, 32, 3
STAGES = ("preprocess", "normal", "multi_worker_mirrored", "evaluate")


def cells(options: Options) -> list[dict[str, Any]]:
    """Each stage at each scale, the stages in pipeline order within a round (a stage reads what the one before
    wrote, at its scale)."""
    return [{"stage": stage, "scale": scale} for scale in options.extra.get("scales", [1, 10]) for stage in STAGES]


def write_set(path: Path, images: int, side: int = SIZE, seed: int = 0) -> None:
    """An uncompressed .npz of ``images`` learnable colour images (``side`` x ``side`` x 3, class k brightest in
    channel k), written a chunk at a time: never held whole."""
    rng = np.random.default_rng(seed)
    labels = np.arange(images) % CLASSES
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, {"descr": "|u1", "fortran_order": False,
                                                          "shape": (images, side, side, 3)})
            for start in range(0, images, 8192):
                chunk = rng.integers(0, 60, (min(8192, images - start), side, side, 3), dtype=np.uint8)
                for label in range(CLASSES):
                    chunk[labels[start:start + len(chunk)] == label, :, :, label] += 150
                member.write(chunk.tobytes())
        with archive.open("y.npy", "w") as member:
            np.lib.format.write_array(member, labels)


def setup(options: Options) -> Path:
    """A scratch project: each scale's set as SCALEx/parts.npz, and a params file."""
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-memory-"))
    for scale in options.extra.get("scales", [1, 10]):
        (root / f"{scale}x").mkdir()
        write_set(root / f"{scale}x" / "parts.npz", IMAGES * scale)
    (root / "params.yaml").write_text(Path("params.yaml").read_text())
    return root


def teardown(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


def _peak(command: list[str]) -> tuple[float, float]:
    """Run ``command``; the peak resident memory of its largest process in MB, and its wall seconds."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{command[1]} exited {os.waitstatus_to_exitcode(status)}:\n{process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
    return usage.ru_maxrss / 1024, seconds


def measure(cell: dict[str, Any], root: Path, options: Options) -> dict[str, float]:
    folder = root / f"{cell['scale']}x"
    overrides = [f"data.source={folder / 'parts.npz'}", f"mlflow.tracking_uri=sqlite:///{folder}/mlflow.db",
                 "mlflow.log_models=false", f"model.kind={options.models[0]}", f"train.epochs={options.epochs}",
                 f"train.batch_size={options.batches[0]}", "distributed.workers=2"]
    sets = ["--params", str(root / "params.yaml"), *(arg for item in overrides for arg in ("--set", item))]
    stage = cell["stage"]
    if stage == "preprocess":
        shutil.rmtree(folder / "prepared", ignore_errors=True)
        command = [sys.executable, "stages/preprocess.py", *sets, "--out", str(folder / "prepared"),
                   "--report", str(folder / "data.json")]
    elif stage == "evaluate":
        command = [sys.executable, "stages/evaluate.py", *sets, "--data", str(folder / "prepared"),
                   "--models", str(folder / "models"), "--train-reports", str(folder / "reports"),
                   "--reports", str(folder / "eval"), "--name", "normal", "--name", "multi_worker_mirrored"]
    else:
        shutil.rmtree(folder / "backups", ignore_errors=True)  # each round trains anew
        command = run_command(root / "params.yaml", overrides, strategy="default" if stage == "normal" else stage,
                              name=stage, data=folder / "prepared", models=folder / "models",
                              reports=folder / "reports", backups=folder / "backups")
    peak, seconds = _peak(command)
    return {"peak_mb": peak, "seconds": seconds}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """A row per stage: its peak memory at each scale and the ratio of the medians, and its wall time."""
    scales = sorted({cell.params["scale"] for cell in result.cells})
    by = {(cell.params["stage"], cell.params["scale"]): cell for cell in result.cells}
    rows = []
    for stage in STAGES:
        cells_of = [by[stage, scale] for scale in scales if (stage, scale) in by]
        peaks = [spread(cell.values("peak_mb"), 0) for cell in cells_of]
        medians = [float(np.median(cell.values("peak_mb"))) for cell in cells_of]
        ratio = f"{medians[-1] / medians[0]:.2f}x" if len(medians) > 1 else ""
        rows.append([stage, *peaks, ratio, *(spread(cell.values("seconds"), 1) for cell in cells_of)])
    return (["stage", *(f"peak MB, {IMAGES * s:,} images" for s in scales), "ratio",
             *(f"seconds, {IMAGES * s:,}" for s in scales)], rows)
