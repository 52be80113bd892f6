"""Benchmark: what Ray costs as the launcher of multi_worker_mirrored, against tfdist's local launcher.

The train stage (2 workers, the offline sample prepared in a scratch folder) once
per launcher per round, each in a scratch folder and MLflow store of its own:
the stage's wall time, how long the chief took to reach ``fit`` (its
``startup_seconds``, counted from its own process start), the wall time outside
``fit`` (process start-up, Ray's cluster and worker group, the chief's saving
and tracking), and the steady step. Every run must end with the same weights
(the launcher changes no result); a run that does not stops the benchmark.

    python -m benchmarks launchers --rounds 3 --epochs 2     # about 3 min
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import step_ms
from benchmarks.harness import Options
from benchmarks.results import Result, spread
from stages.train import run_command

TITLE = "Ray against the local launcher: multi_worker_mirrored, 2 workers, the offline sample"
DEFAULTS = {"models": ("mlp",), "batches": (25,), "epochs": 2}


def setup(options: Options) -> dict[str, Any]:
    """A scratch folder with the sample prepared once (both launchers read the same files)."""
    scratch = Path(tempfile.mkdtemp(prefix="tfdist-bench-launchers-"))
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["data"]["source"] = "sample"
    (scratch / "params.yaml").write_text(yaml.safe_dump(params))
    subprocess.run([sys.executable, "-m", "stages.preprocess", "--params", str(scratch / "params.yaml"),
                    "--out", str(scratch / "prepared"), "--report", str(scratch / "data.json")],
                   check=True, capture_output=True)
    return {"scratch": scratch, "weights": set()}


def teardown(context: dict[str, Any]) -> None:
    shutil.rmtree(context["scratch"], ignore_errors=True)


def cells(options: Options) -> list[dict[str, Any]]:
    return [{"model": model, "batch": batch, "launcher": launcher}
            for model in options.models for batch in options.batches for launcher in ("local", "ray")]


def measure(cell: dict[str, Any], context: dict[str, Any], options: Options) -> dict[str, float]:
    scratch: Path = context["scratch"]
    root = Path(tempfile.mkdtemp(prefix=f"{cell['launcher']}-", dir=scratch))
    params = yaml.safe_load((scratch / "params.yaml").read_text())
    params["train"].update(epochs=options.epochs, batch_size=cell["batch"])
    params["model"]["kind"] = cell["model"]
    params["distributed"]["launcher"] = cell["launcher"]
    params["mlflow"] = {**params["mlflow"], "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db", "log_models": False}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    command = run_command(root / "params.yaml", strategy="multi_worker_mirrored", name="bench", data=scratch / "prepared",
                          models=root / "models", reports=root / "reports", backups=root / "backups")
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode:
        raise SystemExit(f"{cell['launcher']} failed:\n{done.stderr[-3000:]}")
    report = json.loads((root / "reports" / "bench.json").read_text())
    context["weights"].add(report["weights_sha256"])
    if len(context["weights"]) > 1:
        raise SystemExit(f"the launchers ended with different weights: {sorted(context['weights'])}")
    shutil.rmtree(root, ignore_errors=True)
    return {"wall_s": wall, "startup_s": report["startup_seconds"], "outside_fit_s": wall - report["train_seconds"],
            "step_ms": step_ms(report)}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    labels = {"local": "local", "ray": "ray (a local Ray cluster)"}
    rows = [[labels[cell.params["launcher"]], spread(cell.values("wall_s"), 1), spread(cell.values("startup_s"), 1),
             spread(cell.values("outside_fit_s"), 1), spread(cell.values("step_ms"), 1)] for cell in result.cells]
    return ["launcher", "wall (s)", "chief to fit (s)", "outside fit (s)", "steady step (ms)"], rows
