"""Benchmark: what each stage costs before it does its work, with and without compiled bytecode.

Each stage command runs in a scratch copy of the project (offline sample, 1
epoch, models not logged), its wall time measured; for training also the
report's ``startup_seconds`` (process start to the first call of ``fit``).
Every command runs both ways, alternated: as installed (``make install``
compiles every package's ``.pyc``: ``uv sync --compile-bytecode``), and as a
venv without them on a machine where ``PYTHONDONTWRITEBYTECODE`` is set
(``PYTHONPYCACHEPREFIX`` pointed at an empty folder makes Python look for
bytecode there only, so it compiles every module from source, every time).
``--set pipeline=true`` adds a fresh ``dvc repro`` of a clone of this commit,
both ways (what a user's first run costs).

    python -m benchmarks startup --rounds 3                      # about 5 min
    python -m benchmarks startup --rounds 3 --set pipeline=true  # about 15 min
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

from benchmarks.harness import Options
from benchmarks.results import Result, median, spread

TITLE = "each stage's start, with and without compiled bytecode (the offline sample, 1 epoch)"
DEFAULTS = {"models": ("mlp",), "batches": (25,), "epochs": 1}

ROOT = Path(__file__).resolve().parents[1]
WAYS = (".pyc", "no .pyc")
COMMANDS = {
    "import tfdist.train.stage (the train entry)": ["-c", "import tfdist.train.stage"],
    "import tensorflow (tf_keras)": ["-c", "import tfdist.tf_imports"],
    "import mlflow": ["-c", "import mlflow"],
    "preprocess": [str(ROOT / "stages" / "preprocess.py")],
    "train (normal)": [str(ROOT / "stages" / "train.py"), "--strategy", "default", "--name", "normal"],
    "evaluate": [str(ROOT / "stages" / "evaluate.py"), "--name", "normal"],
}
PIPELINE = "fresh dvc repro (the default pipeline)"


def setup(options: Options) -> dict[str, Any]:
    """A scratch project (params.yaml only: the stages write beside it) and the two environments."""
    scratch = Path(tempfile.mkdtemp(prefix="tfdist-bench-startup-"))
    (scratch / "project").mkdir()
    shutil.copy(ROOT / "params.yaml", scratch / "project" / "params.yaml")
    empty = scratch / "no-bytecode"
    empty.mkdir()
    base = {key: value for key, value in os.environ.items() if key not in ("PYTHONPYCACHEPREFIX", "TF_CONFIG")}
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"  # dvc's stages run this python
    envs = {".pyc": base, "no .pyc": {**base, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(empty)}}
    return {"scratch": scratch, "envs": envs, "clones": 0}


def teardown(context: dict[str, Any]) -> None:
    shutil.rmtree(context["scratch"], ignore_errors=True)


def cells(options: Options) -> list[dict[str, Any]]:
    commands = [*COMMANDS, *((PIPELINE,) if options.extra.get("pipeline") else ())]
    return [{"command": command, "way": way} for command in commands for way in WAYS]


def measure(cell: dict[str, Any], context: dict[str, Any], options: Options) -> dict[str, float]:
    env = context["envs"][cell["way"]]
    if cell["command"] == PIPELINE:
        return {"wall_s": _fresh_repro(context, env)}
    work = context["scratch"] / "project"
    sets = ["--set", f"train.epochs={options.epochs}", "--set", "mlflow.log_models=false", "--set", "data.source=sample"]
    arguments = COMMANDS[cell["command"]]
    wall = _timed([sys.executable, *arguments, *(sets if arguments[0] != "-c" else [])], work, env)
    if cell["command"].startswith("train"):
        report = json.loads((work / "reports" / "train" / "normal.json").read_text())
        return {"wall_s": wall, "startup_s": report["startup_seconds"]}
    return {"wall_s": wall}


def _timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def _fresh_repro(context: dict[str, Any], env: dict[str, str]) -> float:
    """A fresh clone of this commit (the committed baseline, no data, models or store), ``dvc repro`` in it."""
    context["clones"] += 1
    clone = context["scratch"] / f"clone-{context['clones']}"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    if (ROOT / "vega" / "offline.html").is_file():  # built by make install, not tracked
        shutil.copy2(ROOT / "vega" / "offline.html", clone / "vega")
    seconds = _timed([str(Path(sys.executable).parent / "dvc"), "repro", "--force", "--quiet"], clone,
                     {**env, "PYTHONPATH": f"{clone / 'src'}{os.pathsep}{clone}"})
    shutil.rmtree(clone, ignore_errors=True)
    return seconds


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    rows = []
    for command in dict.fromkeys(cell.params["command"] for cell in result.cells):
        compiled, source = (result.cell(command=command, way=way) for way in WAYS)
        assert compiled is not None and source is not None
        ratio = median(source.values("wall_s")) / median(compiled.values("wall_s"))
        fit = (f"{spread(compiled.values('startup_s'), 1)} (no .pyc: {spread(source.values('startup_s'), 1)})"
               if compiled.values("startup_s") else "")
        rows.append([command, spread(compiled.values("wall_s"), 1), spread(source.values("wall_s"), 1),
                     f"{ratio:.1f}x", fit])
    return ["command", ".pyc (s)", "no .pyc (s)", "no .pyc / .pyc", "start-up to fit (s)"], rows
