"""Resume a training run after a crash: a backup folder per run, keyed by what it trains.

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
  for a restored epoch (extra rows are dropped on restore).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfdist import atomic
from tfdist.config import Config, to_flat_dict
from tfdist.runtime import keras, tf

log = logging.getLogger(__name__)

#: Strategies tf_keras ``BackupAndRestore`` accepts; the others get a plain checkpoint.
BACKUP_AND_RESTORE_STRATEGIES = ("default", "mirrored", "multi_worker_mirrored", "parameter_server", "tpu")


#: Params that change neither a run's result nor where it is tracked.
_NOT_IN_KEY = ("distributed.strategies", "distributed.max_restarts", "mlflow.log_models")


def run_key(config: Config, strategy: str, data_files: Iterable[Path]) -> str:
    """A short hash of what decides a run's result: the params, the strategy, the data bytes.

    The MLflow store and experiment are in it too: the backup names a run of that store.
    """
    params = {key: value for key, value in to_flat_dict(config).items() if key not in _NOT_IN_KEY}
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

    @property
    def state_file(self) -> Path:
        return self.folder / "state.json"

    @property
    def run_id(self) -> str | None:
        return self.state.get("mlflow_run_id")

    @property
    def history(self) -> list[dict[str, float]]:
        return list(self.state.get("history", []))

    def load(self) -> RunBackup:
        try:
            self.state = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            self.state = {}
        except (OSError, json.JSONDecodeError) as err:
            log.warning("ignoring unreadable backup state %s (%s)", self.state_file, err)
            self.state = {}
        return self

    def save(self, **values: Any) -> None:
        self.state.update(values)
        atomic.write_json(self.state_file, self.state)

    def record_epoch(self, row: dict[str, float]) -> None:
        """Keep ``row`` (one epoch's numbers), replacing any earlier row of the same epoch."""
        rows = [r for r in self.history if r["epoch"] != row["epoch"]] + [row]
        self.save(history=sorted(rows, key=lambda r: r["epoch"]))

    def remove(self) -> None:
        """Delete this backup, and the run name's folder if nothing else is left in it."""
        shutil.rmtree(self.folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.folder.parent.rmdir()


def open_backup(root: Path, name: str, key: str) -> tuple[RunBackup, list[RunBackup]]:
    """The backup of run ``name`` with ``key``, and the stale backups of the same name (other keys)."""
    current = RunBackup(root / name / key).load()
    stale = [RunBackup(folder).load() for folder in sorted((root / name).glob("*"))
             if folder.is_dir() and folder.name != key]
    return current, stale


def resume_callbacks(backup: RunBackup, strategy: str, model: Any, record: bool) -> tuple[list[Any], int]:
    """Callbacks that back the run up every epoch, and the epoch ``fit`` starts from.

    Args:
        backup: where to back up.
        strategy: the strategy name (decides the backup mechanism).
        model: the compiled model (for the plain checkpoint).
        record: whether this process writes ``state.json`` (the chief).

    Returns:
        The callbacks to pass to ``fit`` *last* (after the ones that complete an
        epoch's logs), and ``initial_epoch`` for ``fit``.
    """
    callbacks: list[Any] = [_ResumeAnnouncer(backup.folder)]
    if record:
        callbacks.append(_HistoryRecorder(backup))
    keras_dir = backup.folder / "keras"
    if strategy in BACKUP_AND_RESTORE_STRATEGIES:
        callbacks.append(keras.callbacks.BackupAndRestore(str(keras_dir), save_freq="epoch", delete_checkpoint=False))
        return callbacks, 0
    checkpoint = _EpochCheckpoint(model, keras_dir)
    callbacks.append(checkpoint)
    return callbacks, checkpoint.restore()


def restored_history(backup: RunBackup, first_new_epoch: int) -> list[dict[str, float]]:
    """The backed-up rows of the epochs before ``first_new_epoch`` (1-based)."""
    return [row for row in backup.history if row["epoch"] < first_new_epoch]


class _ResumeAnnouncer(keras.callbacks.Callback):
    """Says once, at the first epoch, whether and from where the run resumes."""

    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder
        self.first_epoch: int | None = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.first_epoch is None:
            self.first_epoch = epoch
            if epoch:
                log.info("resuming from the backup in %s: epochs 1-%d are done, continuing at epoch %d",
                         self.folder, epoch, epoch + 1)


class _HistoryRecorder(keras.callbacks.Callback):
    """Writes each epoch's logs to ``state.json`` before the model backup of that epoch."""

    def __init__(self, backup: RunBackup):
        super().__init__()
        self.backup = backup

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.backup.record_epoch({"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}})


class _EpochCheckpoint(keras.callbacks.Callback):
    """Model, optimizer and epoch in a ``tf.train.Checkpoint``, for strategies BackupAndRestore refuses."""

    def __init__(self, model: Any, folder: Path):
        super().__init__()
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, epoch=self.epoch)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(folder), max_to_keep=1)

    def restore(self) -> int:
        """Restore the latest checkpoint if there is one; return the epochs it had finished."""
        if self.manager.latest_checkpoint:
            self.checkpoint.restore(self.manager.latest_checkpoint).assert_existing_objects_matched()
        return int(self.epoch.numpy())

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch.assign(epoch + 1)
        self.manager.save()
