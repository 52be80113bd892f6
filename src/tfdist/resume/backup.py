"""A run's backup: a folder per run, keyed by what it trains, that a rerun resumes from.

Each train stage run backs up its state every epoch into
``<backups>/<name>/<key>/``, where ``key`` hashes everything that decides the
result (params, strategy, prepared data). The folder lives outside the stage's
DVC outputs, so ``dvc repro`` does not delete it before rerunning the stage.
Run again with the same key, the stage resumes from the last finished epoch
and continues the same MLflow run; with another key (params changed) it starts
fresh, and the folders of other keys are retired (their runs closed). The
folder is removed once the stage's outputs are written.

What is backed up:

* the model and optimizer: tf_keras ``BackupAndRestore`` where it supports
  the strategy (none, Mirrored, MultiWorkerMirrored, ParameterServer),
  otherwise (OneDevice, CentralStorage) a ``tf.train.CheckpointManager``
  checkpoint plus ``initial_epoch``;
* ``state.json``: the MLflow run id and the per-epoch history so far, written
  before the model backup of the same epoch, so a history row is never missing
  for a restored epoch (extra rows are dropped on restore). Each row keeps the
  time its metrics are stamped with in MLflow, so a resumed run can send the
  restored epochs again and the store keeps one copy of what it already has.

This module keeps the folders and imports no TensorFlow, so a launcher can read
a backup cheaply; the callbacks that fill them are in :mod:`tfdist.resume.checkpoints`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfdist.config.knobs import Config
from tfdist.config.params import identifying_params
from tfdist.files import atomic

log = logging.getLogger(__name__)

#: ``state.json``'s key for each history row's MLflow timestamp (milliseconds), by epoch.
METRIC_TIMESTAMPS = "metric_timestamps"


def run_key(config: Config, strategy: str, data_files: Iterable[Path]) -> str:
    """A short hash of what decides a run's result: the params, the strategy, the data bytes.

    The MLflow store and experiment are in it too: the backup names a run of that
    store. Knobs of role ``operational`` are left out (see :data:`tfdist.config.ROLES`).
    """
    params = identifying_params(config)
    digest = hashlib.sha256()
    digest.update(json.dumps({"config": params, "strategy": strategy}, sort_keys=True).encode())
    for path in sorted(data_files):
        digest.update(path.name.encode())
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


@dataclass
class RunBackup:
    """The backup folder of one run (name + key) and its ``state.json``."""

    folder: Path
    state: dict[str, Any] = field(default_factory=dict)
    #: Why this backup cannot be resumed from (None: it can, or there is none).
    damage: str | None = None

    @property
    def state_file(self) -> Path:
        return self.folder / "state.json"

    @property
    def run_id(self) -> str | None:
        return self.state.get("mlflow_run_id")

    @property
    def history(self) -> list[dict[str, float]]:
        return list(self.state.get("history", []))

    @property
    def checkpoint_folder(self) -> Path:
        """Where the model and optimizer are backed up (:mod:`tfdist.resume.checkpoints`)."""
        return self.folder / "keras"

    def load(self) -> RunBackup:
        """Read ``state.json``; a state that cannot be what :meth:`save` wrote leaves it empty and says why in :attr:`damage`."""
        self.state, self.damage = {}, None
        try:
            state = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            if self.checkpoint_folder.exists():
                self.damage = "a model checkpoint without its state.json"
            return self
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            self.damage = f"state.json is unreadable: {err}"
            return self
        if not _valid_state(state):
            self.damage = "state.json does not hold a run id and a history of epochs"
            return self
        self.state = state
        return self

    def set_aside(self, why: str) -> Path:
        """Move this damaged backup into ``<backups>/.damaged/``, so that training starts afresh; where it went."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = self.folder.parent.parent / ".damaged" / f"{self.folder.parent.name}-{self.folder.name}-{stamp}"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.folder, target)
        log.warning("the backup in %s is damaged (%s): set aside in %s; training starts afresh", self.folder, why, target)
        self.state, self.damage = {}, None
        return target

    def save(self, **values: Any) -> None:
        self.state.update(values)
        atomic.write_json(self.state_file, self.state)

    def record_epoch(self, row: dict[str, float], timestamp_ms: int) -> None:
        """Keep ``row`` (one epoch's numbers) and its MLflow timestamp, replacing any earlier row of the same epoch."""
        rows = [r for r in self.history if r["epoch"] != row["epoch"]] + [row]
        stamps = {**self.state.get(METRIC_TIMESTAMPS, {}), str(int(row["epoch"])): timestamp_ms}
        self.save(history=sorted(rows, key=lambda r: r["epoch"]), **{METRIC_TIMESTAMPS: stamps})

    def epoch_metrics(self, epoch: int) -> tuple[dict[str, float], int] | None:
        """The metrics of backed-up ``epoch`` (1-based) and their MLflow timestamp, or None if it has no row."""
        stamp = self.state.get(METRIC_TIMESTAMPS, {}).get(str(epoch))
        row = next((r for r in self.history if r["epoch"] == epoch), None)
        if row is None or stamp is None:
            return None
        return {key: value for key, value in row.items() if key != "epoch"}, stamp

    def remove(self) -> None:
        """Delete this backup, and the run name's folder if nothing else is left in it."""
        shutil.rmtree(self.folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.folder.parent.rmdir()


def _valid_state(state: Any) -> bool:
    """Whether ``state`` has the shape :meth:`RunBackup.save` gives it: a dict whose history rows each name their epoch."""
    if not isinstance(state, dict):
        return False
    history = state.get("history", [])
    return (isinstance(state.get("mlflow_run_id", ""), str) and isinstance(history, list)
            and all(isinstance(row, dict) and isinstance(row.get("epoch"), int | float) for row in history)
            and isinstance(state.get(METRIC_TIMESTAMPS, {}), dict))


def backups_of(root: Path, name: str) -> list[RunBackup]:
    """Every backup of run ``name``, whatever its key."""
    return [RunBackup(folder).load() for folder in sorted((root / name).glob("*")) if folder.is_dir()]


def open_backup(root: Path, *, name: str, key: str) -> tuple[RunBackup, list[RunBackup]]:
    """The backup of run ``name`` with ``key``, and the stale backups of the same name (other keys)."""
    return RunBackup(root / name / key).load(), [b for b in backups_of(root, name) if b.folder.name != key]


def restored_history(backup: RunBackup, first_new_epoch: int) -> list[dict[str, float]]:
    """The backed-up rows of the epochs before ``first_new_epoch`` (1-based)."""
    return [row for row in backup.history if row["epoch"] < first_new_epoch]


def close_stopped_runs(config: Config, backups: Path, name: str, status: str) -> None:
    """Close the MLflow run a stopped chief left RUNNING (``status``: FAILED or KILLED); its backup names the run.

    The launcher's answer to a cluster attempt that ended early. A chief stopped
    after another task failed may have ended its run KILLED (the launcher's
    SIGTERM is all it saw): the run failed, and says FAILED.
    """
    run_ids = [backup.run_id for backup in backups_of(backups, name) if backup.run_id]
    if not run_ids:
        return
    from tfdist.tracking import experiment, runs  # MLflow's import, only where a run is left to close

    experiment.configure(config.mlflow)
    for run_id in run_ids:
        if runs.close_if_running(run_id, status, overriding=("KILLED",) if status == "FAILED" else ()):
            log.info("marked MLflow run %s %s: its chief was stopped before it could", run_id, status)
