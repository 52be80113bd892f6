"""Benchmark: what the tracking store costs a pipeline: sqlite, PostgreSQL, an MLflow server on PostgreSQL.

The same small pipeline (``dvc repro`` in a fresh clone of this commit: the
offline sample, normal + a 2-worker multi_worker_mirrored, 2 epochs, models
logged) once per store per round, the stores alternating round by round.
Needs PostgreSQL up (``make postgres``); the databases it makes are dropped as
each run ends.

    python -m benchmarks tracking_stores --rounds 3     # about 8 min
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import tracking_server
from benchmarks.harness import Options
from benchmarks.results import Result, median, spread

ROOT = Path(__file__).resolve().parents[1]
PARAMS = {"data": {"source": "sample"},
          "distributed": {"strategies": ["multi_worker_mirrored"]}, "mlflow": {"log_models": True}}


@contextmanager
def database() -> Iterator[str]:
    name = f"tfdist_bench_{uuid.uuid4().hex[:8]}"
    subprocess.run(["createdb", name], check=True)
    try:
        yield f"postgresql://{getpass.getuser()}@/{name}?host=/var/run/postgresql"
    finally:
        subprocess.run(["dropdb", "--force", name], check=False)


def clone(target: Path, tracking_uri: str, epochs: int) -> Path:
    """A fresh clone of this repo's HEAD in ``target`` (what a user gets), with the benchmark's params committed."""
    subprocess.run(["git", "clone", "-q", "--local", str(ROOT), str(target)], check=True)
    for generated in ("dvc.lock", "reports"):  # the committed baseline would make dvc repro a no-op
        subprocess.run(["git", "rm", "-rq", generated], cwd=target, check=True)
    shutil.copy2(ROOT / "vega" / "offline.html", target / "vega" / "offline.html")  # built by make install, not tracked
    params = yaml.safe_load((target / "params.yaml").read_text())
    chosen = {**PARAMS, "train": {"epochs": epochs}, "mlflow": {**PARAMS["mlflow"], "tracking_uri": tracking_uri}}
    for key, value in chosen.items():
        params[key] = {**params[key], **value}
    (target / "params.yaml").write_text(yaml.safe_dump(params))
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@tfdist.invalid"]
    subprocess.run([*git, "commit", "-qam", "benchmark params"], cwd=target, check=True)
    return target


def repro_seconds(tracking_uri: str, epochs: int) -> float:
    with tempfile.TemporaryDirectory(prefix="tfdist-bench-") as folder:
        project = clone(Path(folder) / "repo", tracking_uri, epochs)
        env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
        env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{env['PATH']}"  # this venv's dvc
        env["PYTHONPATH"] = f"{project / 'src'}{os.pathsep}{project}"  # the clone's own code, not the editable install's
        start = time.perf_counter()
        done = subprocess.run(["dvc", "repro"], cwd=project, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"dvc repro failed on {tracking_uri}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return time.perf_counter() - start


TITLE = "the tracking store's cost to a small pipeline (fresh clone, sample data, normal + multi_worker_mirrored)"
DEFAULTS = {"models": ("mlp",), "batches": (25,), "epochs": 2}
STORES = ("sqlite (embedded)", "PostgreSQL (direct)", "http server on PostgreSQL")


def setup(options: Options) -> dict[str, Any]:
    return {"artifacts": Path(tempfile.mkdtemp(prefix="tfdist-bench-artifacts-"))}


def teardown(context: dict[str, Any]) -> None:
    shutil.rmtree(context["artifacts"], ignore_errors=True)


def cells(options: Options) -> list[dict[str, Any]]:
    return [{"store": store} for store in STORES]


def measure(cell: dict[str, Any], context: dict[str, Any], options: Options) -> dict[str, float]:
    if cell["store"] == STORES[0]:
        return {"repro_s": repro_seconds("sqlite:///mlruns/mlflow.db", options.epochs)}
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(database())
        if cell["store"] == STORES[2]:
            store, _ = stack.enter_context(tracking_server(store, context["artifacts"]))
        return {"repro_s": repro_seconds(store, options.epochs)}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    sqlite = result.cell(store=STORES[0])
    base = median(sqlite.values("repro_s")) if sqlite else float("nan")
    rows = [[cell.params["store"], spread(cell.values("repro_s"), 1), f"{median(cell.values('repro_s')) / base:.2f}x"]
            for cell in result.cells]
    return ["store", "dvc repro (s)", "vs sqlite"], rows
