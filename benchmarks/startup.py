"""Benchmark 5: what each stage costs before it does its work, with and without compiled bytecode.

Runs each stage command in a scratch copy of the project (offline sample,
1 epoch, models not logged) and reports its wall time; for training, also the
report's ``startup_seconds`` (process start to the first call of ``fit``).

Every command runs twice, side by side: once as installed (``make install``
compiles every package's ``.pyc``: ``uv sync --compile-bytecode``) and once
as a venv without them on a machine where ``PYTHONDONTWRITEBYTECODE`` is set
(uv, unlike pip, writes no ``.pyc`` by default, and that variable stops Python
writing any): ``PYTHONPYCACHEPREFIX`` pointed at an empty folder makes Python
look for bytecode there only, so it compiles every module from source, every
time, as it did.

    python -m benchmarks startup              # the commands (about 2 min)
    python -m benchmarks startup --pipeline   # also a fresh dvc repro of a clone, both ways (about 8 min)
    python -m benchmarks startup --before REV # a fresh dvc repro of REV's clone and of this one's, alternating,
                                              # each stage timed (about 3 min a repro)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETS = ["--set", "train.epochs=1", "--set", "mlflow.log_models=false", "--set", "data.source=sample"]


def environments(scratch: Path) -> dict[str, dict[str, str]]:
    """The two ways of running: without any .pyc (compiled from source each time), and as installed."""
    empty = scratch / "no-bytecode"
    empty.mkdir()
    base = {key: value for key, value in os.environ.items() if key != "PYTHONPYCACHEPREFIX"}
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"  # dvc's stages run this python
    return {"no .pyc": {**base, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(empty)},
            ".pyc": base}


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} exited {result.returncode}:\n{result.stderr[-2000:]}")
    return time.perf_counter() - start


def startups(reports: Path) -> dict[str, float]:
    return {path.stem: json.loads(path.read_text()).get("startup_seconds") or 0.0
            for path in sorted(reports.glob("*.json"))}


def commands(work: Path, envs: dict[str, dict[str, str]], repeats: int) -> list[list[str]]:
    python = sys.executable
    stages = ROOT / "stages"
    cases = [("import tfdist.train.stage (the train entry)", [python, "-c", "import tfdist.train.stage"]),
             ("import tensorflow (tf_keras)", [python, "-c", "import tfdist.tf_imports"]),
             ("import mlflow", [python, "-c", "import mlflow"]),
             ("preprocess", [python, str(stages / "preprocess.py"), *SETS]),
             ("train (normal, 1 epoch)", [python, str(stages / "train.py"), "--strategy", "default", "--name", "normal",
                                          *SETS]),
             ("evaluate", [python, str(stages / "evaluate.py"), "--name", "normal", *SETS])]
    rows = []
    for label, command in cases:
        walls: dict[str, list[float]] = {way: [] for way in envs}
        fits: dict[str, list[float]] = {way: [] for way in envs}
        for _ in range(repeats):
            for way, env in envs.items():  # alternated, so both ways see the same machine
                walls[way].append(timed(command, work, env))
                if label.startswith("train"):
                    fits[way].append(startups(work / "reports/train")["normal"])
        old, new = (statistics.median(walls[way]) for way in envs)
        fit = " → ".join(f"{statistics.median(fits[way]):.1f}" for way in envs) if fits[".pyc"] else ""
        rows.append([label, f"{old:.1f}", f"{new:.1f}", f"{old / new:.1f}×", fit])
    return rows


def pipeline(scratch: Path, envs: dict[str, dict[str, str]]) -> list[list[str]]:
    """A fresh ``dvc repro`` of a clone of this project, each way, one after the other."""
    rows = []
    for way, env in envs.items():
        clone = scratch / f"clone-{way.strip('. ').replace(' ', '-')}"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        seconds = timed([str(Path(sys.executable).parent / "dvc"), "repro", "--quiet"], clone, env)
        starts = startups(clone / "reports/train")
        rows.append([way, f"{seconds:.0f}", ", ".join(f"{name} {value:.1f}" for name, value in starts.items())])
    return rows


def stage_seconds(clone: Path, env: dict[str, str]) -> dict[str, float]:
    """A fresh ``dvc repro`` in ``clone``: each stage's seconds (from DVC's "Running stage" lines), and the total."""
    start = last = time.perf_counter()
    stage, seconds = "dvc's start", {}
    with subprocess.Popen([str(Path(sys.executable).parent / "dvc"), "repro"], cwd=clone, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as process:
        for line in process.stdout:
            if line.startswith("Running stage '"):
                now = time.perf_counter()
                seconds[stage], stage, last = now - last, line.split("'")[1], now
    if process.returncode:
        raise SystemExit(f"error: dvc repro in {clone} exited {process.returncode}")
    now = time.perf_counter()
    seconds[stage] = now - last
    seconds["total"] = now - start
    return seconds


def pipeline_against(scratch: Path, before: str, rounds: int) -> list[list[str]]:
    """A fresh ``dvc repro`` of a clone of ``before`` and of this checkout's HEAD, alternating, each stage timed.

    Below the stages, each train stage's ``startup_seconds`` (process start to ``fit``) from its report.

    As a user's clone: the committed baseline, no data, models or store. Each clone runs its own
    code (``PYTHONPATH``: its src/ and stages/ before the editable install's).
    """
    env = environments(scratch)[".pyc"]
    runs: dict[str, list[dict[str, float]]] = {before: [], "this checkout": []}
    for index in range(rounds):
        for way, revision in ((before, before), ("this checkout", "HEAD")):
            clone = scratch / f"clone-{index}-{'before' if way == before else 'now'}"
            subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
            subprocess.run(["git", "-C", str(clone), "checkout", "-q", revision], check=True)
            if (ROOT / "vega" / "offline.html").is_file():
                shutil.copy2(ROOT / "vega" / "offline.html", clone / "vega")
            seconds = stage_seconds(clone, {**env, "PYTHONPATH": f"{clone / 'src'}{os.pathsep}{clone}"})
            seconds.update({f"start-up to fit: {name}": value for name, value in startups(clone / "reports/train").items()})
            runs[way].append(seconds)
            print(f"{way}, round {index + 1}: {runs[way][-1]['total']:.0f} s", file=sys.stderr, flush=True)
    names = list(dict.fromkeys(name for way in runs.values() for seconds in way for name in seconds))
    return [[name, *(" / ".join(f"{seconds[name]:.1f}" if name in seconds else "–" for seconds in way)
                     for way in runs.values())] for name in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", action="store_true", help="also time a fresh dvc repro of a clone, both ways")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each command each way (median shown)")
    parser.add_argument("--before", help="a git revision: a fresh dvc repro of it against this checkout's, stage by stage")
    parser.add_argument("--rounds", type=int, default=1, help="with --before: repros of each, alternating")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tfdist-bench-startup-"))
    try:
        if args.before:
            print(table(["stage (s)", f"{args.before} (fresh clone)", "this checkout (fresh clone)"],
                        pipeline_against(scratch, args.before, args.rounds)))
            return
        work = scratch / "project"
        work.mkdir()
        shutil.copy(ROOT / "params.yaml", work / "params.yaml")
        envs = environments(scratch)
        print(table(["command", "no .pyc (s)", ".pyc (s)", "ratio", "start-up to fit (s)"],
                    commands(work, envs, args.repeats)))
        if args.pipeline:
            print()
            print(table(["fresh dvc repro", "wall time (s)", "train start-ups (s)"], pipeline(scratch, envs)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
