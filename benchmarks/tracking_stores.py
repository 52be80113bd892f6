"""What the tracking store costs a pipeline: sqlite vs PostgreSQL vs an MLflow server on PostgreSQL.

Runs the same small pipeline (``dvc repro`` in a fresh copy of the repo, the
offline sample, normal + multi_worker_mirrored, 2 epochs, models logged) once
per store per round, alternating the stores round by round so machine noise
spreads evenly, and prints the median wall times. Needs PostgreSQL up
(``make postgres``) and a free port for the server; the databases it makes
are dropped at the end. Run from the project root:

    python -m benchmarks tracking_stores --rounds 3
"""

from __future__ import annotations

import argparse
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

import yaml

from benchmarks.common import table, tracking_server
from benchmarks.results import median

PARAMS = {"data": {"source": "sample"}, "train": {"epochs": 2},
          "distributed": {"strategies": ["multi_worker_mirrored"]}, "mlflow": {"log_models": True}}


@contextmanager
def database() -> Iterator[str]:
    name = f"tfdist_bench_{uuid.uuid4().hex[:8]}"
    subprocess.run(["createdb", name], check=True)
    try:
        yield f"postgresql://{getpass.getuser()}@/{name}?host=/var/run/postgresql"
    finally:
        subprocess.run(["dropdb", "--force", name], check=False)


def clone(target: Path, tracking_uri: str) -> Path:
    """A fresh clone of this repo's HEAD in ``target`` (what a user gets), with the benchmark's params committed."""
    subprocess.run(["git", "clone", "-q", "--local", ".", str(target)], check=True)
    for generated in ("dvc.lock", "reports"):  # the committed baseline would make dvc repro a no-op
        subprocess.run(["git", "rm", "-rq", generated], cwd=target, check=True)
    shutil.copy2("vega/offline.html", target / "vega" / "offline.html")  # built by make install, not tracked
    params = yaml.safe_load((target / "params.yaml").read_text())
    for key, value in {**PARAMS, "mlflow": {**PARAMS["mlflow"], "tracking_uri": tracking_uri}}.items():
        params[key] = {**params[key], **value}
    (target / "params.yaml").write_text(yaml.safe_dump(params))
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@tfdist.invalid"]
    subprocess.run([*git, "commit", "-qam", "benchmark params"], cwd=target, check=True)
    return target


def repro_seconds(tracking_uri: str) -> float:
    with tempfile.TemporaryDirectory(prefix="tfdist-bench-") as folder:
        project = clone(Path(folder) / "repo", tracking_uri)
        env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
        env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{env['PATH']}"  # this venv's dvc
        start = time.perf_counter()
        done = subprocess.run(["dvc", "repro"], cwd=project, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"dvc repro failed on {tracking_uri}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    times: dict[str, list[float]] = {"sqlite (embedded)": [], "PostgreSQL (direct)": [], "http server on PostgreSQL": []}
    with tempfile.TemporaryDirectory(prefix="tfdist-bench-artifacts-") as artifacts:
        for round_ in range(rounds):
            times["sqlite (embedded)"].append(repro_seconds("sqlite:///mlruns/mlflow.db"))
            with database() as store:
                times["PostgreSQL (direct)"].append(repro_seconds(store))
            with database() as store, tracking_server(store, Path(artifacts)) as (url, _):
                times["http server on PostgreSQL"].append(repro_seconds(url))
            print(f"round {round_ + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()), file=sys.stderr)
    base = median(times["sqlite (embedded)"])
    print(table(["store", "median dvc repro (s)", "runs (s)", "vs sqlite"],
                [[store, f"{median(values):.1f}", " ".join(f"{v:.1f}" for v in values), f"{median(values) / base:.2f}x"]
                 for store, values in times.items()]))


if __name__ == "__main__":
    main()
