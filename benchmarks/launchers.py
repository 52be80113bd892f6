"""What Ray costs as the launcher of multi_worker_mirrored, against tfdist's local launcher.

Runs the train stage (2 workers, the prepared sample in ``data/prepared``) once
per launcher per round, alternating which goes first, each in its own temp
folder and MLflow store, and prints medians: the stage's wall time, how long the
chief took to reach ``fit`` (its ``startup_seconds``, counted from its own
process start), the wall time outside ``fit`` (process start-up, Ray's cluster
and worker group, the chief's saving and tracking), and the steady step.
Also checks that both launchers end with the same weights. Run from the
project root on an otherwise idle machine:

    python -m benchmarks launchers --rounds 3 --epochs 5
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.common import step_ms, table
from benchmarks.results import median
from stages.train import run_command

LAUNCHERS = ("local", "ray")


def run(launcher: str, epochs: int, root: Path) -> dict:
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["train"]["epochs"] = epochs
    params["data"]["source"] = "sample"
    params["distributed"]["launcher"] = launcher
    params["mlflow"] = {**params["mlflow"], "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db", "log_models": False}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    command = run_command(root / "params.yaml", strategy="multi_worker_mirrored", name="bench", data=Path("data/prepared"),
                          models=root / "models", reports=root / "reports", backups=root / "backups")
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True)
    wall = time.monotonic() - started
    if result.returncode:
        raise SystemExit(f"{launcher} failed:\n{result.stderr[-3000:]}")
    report = json.loads((root / "reports" / "bench.json").read_text())
    return {"wall": wall, "startup": report["startup_seconds"], "outside_fit": wall - report["train_seconds"],
            "step_ms": step_ms(report),
            "weights": report["weights_sha256"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {launcher: [] for launcher in LAUNCHERS}
    for round_ in range(args.rounds):
        for launcher in LAUNCHERS if round_ % 2 == 0 else LAUNCHERS[::-1]:
            with tempfile.TemporaryDirectory(prefix=f"tfdist-bench-{launcher}-") as root:
                runs[launcher].append(run(launcher, args.epochs, Path(root)))
            print(f"round {round_ + 1}: {launcher} {runs[launcher][-1]['wall']:.1f} s", file=sys.stderr)
    rows = [[launcher, f"{median([r['wall'] for r in results]):.1f}", f"{median([r['startup'] for r in results]):.1f}",
             f"{median([r['outside_fit'] for r in results]):.1f}", f"{median([r['step_ms'] for r in results]):.1f}"]
            for launcher, results in runs.items()]
    print(table(["launcher", "wall (s)", "chief to fit (s)", "outside fit (s)", "steady step (ms)"], rows))
    digests = {r["weights"] for results in runs.values() for r in results}
    print(f"\nfinal weights: {'identical in every run' if len(digests) == 1 else f'{len(digests)} different digests'}"
          f" ({args.rounds} rounds, {args.epochs} epochs, 2 workers)")


if __name__ == "__main__":
    main()
