"""What the benchmarks that run the real train stage share: the tiled data, the stage's command, its report.

:class:`StageRuns` is the context such a benchmark's ``setup`` returns: a scratch
folder with the prepared digits tiled to :data:`ROWS`, and names for its runs.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import PREPARED, prepared, step_ms, write_prepared_folder
from stages.train import run_command
from tfdist.data.prepared import load_spec, load_split
from tfdist.records.history import read_history

#: Training digits each run reads: the offline sample tiled, so per-epoch costs weigh as on a larger set.
ROWS = 12_000


@dataclass
class StageRuns:
    """A scratch folder with the tiled data, where train stages run one after another under fresh names."""

    root: Path
    data: Path
    names: itertools.count = field(default_factory=itertools.count)

    @classmethod
    def make(cls, prefix: str, rows: int = ROWS) -> StageRuns:
        root = Path(tempfile.mkdtemp(prefix=f"tfdist-bench-{prefix}-"))
        return cls(root, data_folder(root, rows))

    def name(self) -> str:
        return f"run{next(self.names)}"

    def train(self, strategy: str, sets: list[str], *, prefix: tuple[str, ...] = ()) -> dict:
        """One train stage under a fresh name: its report, with its step in ms and its per-epoch history."""
        name = self.name()
        run(self.root, self.data, name, strategy, sets, prefix=prefix)
        return measured(self.root, name)


def model_settings(cell: dict, options: Any) -> list[str]:
    """The train stage's settings for a cell's model kind and per-replica batch, at the run's epochs."""
    return [f"model.kind={cell['model']}", f"train.batch_size={cell['batch']}", f"train.epochs={options.epochs}"]


def data_folder(root: Path, rows: int = ROWS) -> Path:
    folder = root / "prepared"
    spec = load_spec(PREPARED)
    write_prepared_folder(folder, spec, {"train": prepared("train", rows).read(),
                                         **{name: load_split(PREPARED, name, spec).read() for name in ("val", "test")}})
    return folder


def stage_command(root: Path, data: Path, name: str, strategy: str, sets: list[str]) -> list[str]:
    """The train stage on ``data``, its outputs and MLflow store (models not logged) under ``root``."""
    return run_command(Path("params.yaml"), [*sets, "mlflow.log_models=false", f"mlflow.tracking_uri=sqlite:///{root}/mlflow.db"],
                       strategy=strategy, name=name, data=data, models=root / "models", reports=root / "reports",
                       backups=root / "backups")


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
