"""The Keras callbacks that fill a run's backup every epoch and resume from it.

The folders and their ``state.json`` are :mod:`tfdist.resume.backup`'s (no
TensorFlow there, so a launcher reads them cheaply); these callbacks write the
model and optimizer into them: tf_keras ``BackupAndRestore`` where it supports
the strategy, else a ``tf.train.CheckpointManager`` checkpoint and ``initial_epoch``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfdist.resume.backup import RunBackup
from tfdist.tf_imports import keras, tf
from tfdist.tf_private import backup_and_restore_checkpoint, backup_and_restore_epochs

#: Resume messages keep the name of the feature users look for in the log.
resume_log = logging.getLogger("tfdist.resume")
#: The variable :class:`_EpochCheckpoint` keeps the finished epochs in, as ``tf.train.Checkpoint`` names it.
_EPOCH_VARIABLE = "epoch/.ATTRIBUTES/VARIABLE_VALUE"


#: Called with the name of each moment of an epoch's end as it passes (the phase loop's crash points).
Moments = Callable[[str], None]


def resume_callbacks(backup: RunBackup, kind: str, model: Any, record: bool, moments: Moments | None = None
                     ) -> tuple[list[Any], int]:
    """Callbacks that back the run up every epoch, and the epoch ``fit`` starts from.

    Args:
        backup: where to back up.
        kind: the strategy's backup mechanism (:attr:`tfdist.distribute.registry.StrategySpec.backup`):
            ``keras`` for tf_keras ``BackupAndRestore``, ``checkpoint`` for a plain checkpoint.
        model: the compiled model (for the plain checkpoint).
        record: whether this process writes ``state.json`` (the chief).
        moments: told ``epoch.trained``, ``backup.state`` (the chief) and ``backup.written`` at each epoch's end,
            between the backup's steps.

    Returns:
        The callbacks to pass to ``fit`` after the ones that complete an epoch's
        logs and before the ones that publish them (an epoch is published once it
        is backed up), and ``initial_epoch`` for ``fit``.
    """
    moment = functools.partial(_Moment, moments or (lambda name: None))
    callbacks: list[Any] = [_ResumeAnnouncer(backup.folder), moment("epoch.trained")]
    if record:
        callbacks += [_HistoryRecorder(backup), moment("backup.state")]
    keras_dir = backup.checkpoint_folder
    if kind == "keras":
        callbacks.append(keras.callbacks.BackupAndRestore(str(keras_dir), save_freq="epoch", delete_checkpoint=False))
        initial_epoch = 0
    else:
        checkpoint = _EpochCheckpoint(model, keras_dir)
        callbacks.append(checkpoint)
        initial_epoch = checkpoint.restore()
    return [*callbacks, moment("backup.written")], initial_epoch


def checkpoint_damage(backup: RunBackup, kind: str) -> str | None:
    """Why ``backup``'s model checkpoint cannot be resumed from with its history (None: it can, or there is none).

    Every tensor is read, so a truncated or garbled checkpoint is found here,
    not by ``fit`` mid-restore; and every epoch the checkpoint finished must
    have its row in the history, which ``state.json`` records before the model.
    """
    latest = _latest_checkpoint(backup, kind)
    if latest is None:
        return None
    reader = read_whole(latest)
    if isinstance(reader, str):
        return f"its checkpoint {latest} is unreadable: {reader}"
    done = _finished_epochs(reader, kind)
    recorded = {int(row["epoch"]) for row in backup.history}
    if not set(range(1, done + 1)) <= recorded:
        return f"its checkpoint finished {done} epoch(s) but state.json's history has {len(recorded)}"
    return None


def read_whole(checkpoint: str) -> Any:
    """A reader of ``checkpoint`` with every tensor read once, so a truncated or garbled one is found here, not
    mid-restore; or why it cannot be read (a str)."""
    try:
        reader = tf.train.load_checkpoint(checkpoint)
        for variable in reader.get_variable_to_shape_map():
            reader.get_tensor(variable)
    except Exception as err:  # noqa: BLE001  TensorFlow's reader raises OpError, ValueError, or IndexError
        # ("Read less bytes than requested") for a truncated file: any of them means it cannot be resumed from
        return str(err).strip().splitlines()[0]
    return reader


def set_aside_if_damaged(folder: Path, kind: str) -> str | None:
    """Set the backup in ``folder`` aside when it is damaged; the MLflow run it named, to close (None: nothing set aside).

    A damaged backup never blocks training: it is kept for a look, out of the
    way, and the run starts afresh (a crash costs a retraining, as it would
    without backups).
    """
    backup = RunBackup(folder).load()
    why = backup.damage or checkpoint_damage(backup, kind)
    if not why:
        return None
    run_id = backup.run_id  # read before: a backup set aside is emptied
    backup.set_aside(why)
    return run_id or None


def epochs_backed_up(backup: RunBackup, kind: str) -> int:
    """The epochs ``backup``'s model checkpoint finished (0: none), which a resumed ``fit`` starts after."""
    latest = _latest_checkpoint(backup, kind)
    return 0 if latest is None else _finished_epochs(tf.train.load_checkpoint(latest), kind)


def _latest_checkpoint(backup: RunBackup, kind: str) -> str | None:
    folder = backup.checkpoint_folder
    if kind == "keras":
        return backup_and_restore_checkpoint(folder)
    return tf.train.latest_checkpoint(str(folder)) if folder.is_dir() else None


def _finished_epochs(reader: Any, kind: str) -> int:
    return backup_and_restore_epochs(reader) if kind == "keras" else int(reader.get_tensor(_EPOCH_VARIABLE))


class ResumePoint(keras.callbacks.Callback):
    """Calls :meth:`resumed_at` once per ``fit`` with the epochs already done (restored from a backup).

    At the first epoch that runs, or, when the backup held every epoch and
    none runs, at the end of training.
    """

    done: int | None = None

    def resumed_at(self, done: int) -> None:
        raise NotImplementedError

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.done is None:
            self.done = epoch
            self.resumed_at(epoch)

    def on_train_end(self, logs: dict | None = None) -> None:
        if self.done is None:
            self.done = self.params["epochs"]
            self.resumed_at(self.done)


class _ResumeAnnouncer(ResumePoint):
    """Says once whether and from where the run resumes."""

    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder

    def resumed_at(self, done: int) -> None:
        if done == self.params["epochs"]:
            resume_log.info("resuming from the backup in %s: every epoch is done, nothing left to train", self.folder)
        elif done:
            resume_log.info("resuming from the backup in %s: epochs 1-%d are done, continuing at epoch %d",
                            self.folder, done, done + 1)


class _Moment(keras.callbacks.Callback):
    """Tells ``moments`` that moment ``name`` of an epoch's end has passed."""

    def __init__(self, moments: Moments, name: str):
        super().__init__()
        self.moments, self.name = moments, name

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.moments(self.name)


class _HistoryRecorder(keras.callbacks.Callback):
    """Writes each epoch's logs, stamped with the time MLflow records them at, to ``state.json`` before the model backup."""

    def __init__(self, backup: RunBackup):
        super().__init__()
        self.backup = backup

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.backup.record_epoch({"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}},
                                 int(time.time() * 1000))


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
