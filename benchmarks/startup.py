"""Benchmark 6: what each stage costs before it does its work, and a no-op ``dvc repro``.

Runs each stage command once in a scratch copy of the project (offline sample,
1 epoch, models not logged) and reports its wall time; for training, also the
report's ``startup_seconds`` (process start to the first call of ``fit``).

    python benchmarks/startup.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def timed(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True)
    return time.perf_counter() - start


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="tfdist-bench-startup-"))
    shutil.copy(ROOT / "params.yaml", work / "params.yaml")
    python = sys.executable
    sets = ["--set", "train.epochs=1", "--set", "mlflow.log_models=false", "--set", "data.source=sample"]
    rows = [["import tfdist.train.stage (the train entry)", timed([python, "-c", "import tfdist.train.stage"], work), ""],
            ["import tensorflow (tf_keras)", timed([python, "-c", "import tfdist.tf_imports"], work), ""],
            ["import mlflow", timed([python, "-c", "import mlflow"], work), ""],
            ["preprocess", timed([python, str(ROOT / "stages/preprocess.py"), *sets], work), ""]]
    seconds = timed([python, str(ROOT / "stages/train.py"), "--strategy", "default", "--name", "normal", *sets], work)
    startup = json.loads((work / "reports/train/normal.json").read_text())["startup_seconds"]
    rows.append(["train (normal, 1 epoch)", seconds, f"{startup:.1f}"])
    rows.append(["evaluate", timed([python, str(ROOT / "stages/evaluate.py"), "--name", "normal", *sets], work), ""])
    print(table(["command", "wall time (s)", "start-up to fit (s)"], [[r[0], f"{r[1]:.1f}", r[2]] for r in rows]))


if __name__ == "__main__":
    main()
