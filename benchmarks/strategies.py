"""Benchmark 2: every strategy, through the real train stage, at per-replica batch 25 and 256.

Each configuration runs ``python -m stages.train`` in a scratch folder (its
own process and MLflow store, models not logged) on the prepared training
digits tiled to 12,000; the numbers come from the run's report: steady-state
samples/s and seconds per step (epochs after the first), first-epoch overhead,
start-up time, and scaling efficiency = samples/s / (normal samples/s x N),
where N is the replicas (or, for parameter_server, the workers).

    python -m benchmarks strategies [--epochs 4] [--batches 25 256]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import PREPARED, prepared, step_ms, table
from tfdist.compare.compute import time_to_accuracy  # noqa: E402
from tfdist.reports import read_history  # noqa: E402

ROWS = 12_000
CONFIGS = [  # label, strategy, overrides, N for scaling efficiency
    ("normal", "default", [], 1),
    ("mirrored x1", "mirrored", ["distributed.devices=1"], 1),
    ("mirrored x2", "mirrored", ["distributed.devices=2"], 2),
    ("central_storage x2", "central_storage", ["distributed.devices=2"], 2),
    ("multi_worker_mirrored x1", "multi_worker_mirrored", ["distributed.workers=1"], 1),
    ("multi_worker_mirrored x2", "multi_worker_mirrored", ["distributed.workers=2"], 2),
    ("parameter_server 1 worker", "parameter_server", ["distributed.workers=1"], 1),
    ("parameter_server 2 workers", "parameter_server", ["distributed.workers=2"], 2),
]


def data_folder(root: Path) -> Path:
    folder = root / "prepared"
    folder.mkdir()
    train = prepared("train", ROWS)
    np.savez(folder / "train.npz", x=train.x, y=train.y)
    for split in ("val", "test"):
        (folder / f"{split}.npz").write_bytes((PREPARED / f"{split}.npz").read_bytes())
    return folder


def stage_command(root: Path, data: Path, name: str, strategy: str, sets: list[str]) -> list[str]:
    """The train stage on ``data``, its outputs and MLflow store (models not logged) under ``root``."""
    return [sys.executable, "-m", "stages.train", "--strategy", strategy, "--name", name, "--data", str(data),
            "--models", str(root / "models"), "--reports", str(root / "reports"), "--backups", str(root / "backups"),
            *(arg for item in [*sets, "mlflow.log_models=false", f"mlflow.tracking_uri=sqlite:///{root}/mlflow.db"]
              for arg in ("--set", item))]


def report(root: Path, name: str) -> dict:
    return json.loads((root / "reports" / f"{name}.json").read_text())


#: Validation accuracy each model's time to accuracy is measured to: one normal training reaches in 3 epochs.
TARGETS = {"mlp": 0.90, "cnn": 0.95}


def measured(root: Path, name: str) -> dict:
    """The run's report, with its step in ms and its per-epoch history (for time to accuracy)."""
    found = report(root, name)
    found["step_ms"] = step_ms(found)
    found["history"] = read_history(root / "reports" / "history" / f"{name}.csv")
    return found


def add_against(cell: dict[str, list[float]], found: dict, base: dict, target: float) -> None:
    """Append to ``cell`` a measured run's step, accuracy, and speed and time to ``target`` against ``base``'s."""
    cell["step"].append(found["step_ms"])
    cell["speed"].append(found["steady_samples_per_second"] / base["steady_samples_per_second"])
    cell["accuracy"].append(found["val_accuracy"])
    tta, base_tta = time_to_accuracy(found["history"], target), time_to_accuracy(base["history"], target)
    if tta and base_tta:
        cell["tta"].append(base_tta[1] / tta[1])


def run(root: Path, data: Path, name: str, strategy: str, sets: list[str], checkout: Path | None = None,
        prefix: tuple[str, ...] = ()) -> dict:
    """The report of one train stage run; ``checkout``: another checkout of tfdist whose code runs instead;
    ``prefix``: a command to run it under (e.g. ``taskset -c 0``)."""
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")} if checkout else None
    command = [*prefix, *stage_command(root, data, name, strategy, sets)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=checkout, env=env)
    if done.returncode:
        raise SystemExit(f"{name}: the train stage exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return report(root, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batches", type=int, nargs="+", default=[25, 256])
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tfdist-bench-strategies-"))
    data = data_folder(root)
    for batch in args.batches:
        rows, base = [], None
        for i, (label, strategy, sets, n) in enumerate(CONFIGS):
            report = run(root, data, f"b{batch}-{i}", strategy,
                         [*sets, f"train.batch_size={batch}", f"train.epochs={args.epochs}"])
            speed = report["steady_samples_per_second"]
            base = base or speed
            rows.append([label, report["replicas"], report["global_batch_size"], speed, f"{step_ms(report):.2f}",
                         f"{speed / base:.2f}x", f"{speed / (base * n):.0%}",
                         f"{report['first_epoch_overhead_seconds']:.2f}", f"{report['startup_seconds']:.1f}"])
            print(f"batch {batch} {label}: {speed:,.0f} samples/s", flush=True)
        print()
        print(f"per-replica batch {batch}, {ROWS:,} digits, {args.epochs} epochs")
        print(table(["run", "replicas", "global batch", "samples/s", "ms/step", "vs normal", "scaling efficiency",
                     "1st-epoch overhead (s)", "start-up (s)"], rows))
        print()


if __name__ == "__main__":
    main()
