"""The callbacks that back a run up every epoch and resume from it, and the damage check a rerun makes first."""

import numpy as np
import pytest

from tfdist.resume.backup import RunBackup
from tfdist.resume.checkpoints import checkpoint_damage, epochs_backed_up, resume_callbacks, set_aside_if_damaged
from tfdist.tf_imports import keras

X = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
Y = (X[:, 0] > 0).astype("int64")


def fitted(backup: RunBackup, kind: str, epochs: int) -> keras.Model:
    """A tiny model fitted ``epochs`` epochs with the backup's callbacks (resuming from what the backup holds)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    callbacks, initial_epoch = resume_callbacks(backup, kind, model, record=True)
    model.fit(X, Y, epochs=epochs, initial_epoch=initial_epoch, callbacks=callbacks, verbose=0)
    return model


@pytest.mark.parametrize("kind", ["keras", "checkpoint"])
def test_every_epoch_is_backed_up_with_its_history_row_and_a_rerun_resumes_after_it(tmp_path, kind):
    backup = RunBackup(tmp_path / "run" / "key")
    fitted(backup, kind, epochs=2)
    backup = RunBackup(backup.folder).load()
    assert [row["epoch"] for row in backup.history] == [1, 2] and backup.epoch_metrics(2) is not None
    assert epochs_backed_up(backup, kind) == 2 and checkpoint_damage(backup, kind) is None
    fitted(backup, kind, epochs=3)
    assert [row["epoch"] for row in RunBackup(backup.folder).load().history] == [1, 2, 3], "resumed at epoch 3"


def test_a_garbled_checkpoint_is_damage_and_the_backup_is_set_aside_naming_its_run(tmp_path):
    backup = RunBackup(tmp_path / "run" / "key")
    fitted(backup, "checkpoint", epochs=1)
    backup.save(mlflow_run_id="abc123")
    data = next(backup.checkpoint_folder.rglob("*.data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    assert "is unreadable" in checkpoint_damage(RunBackup(backup.folder).load(), "checkpoint")
    assert set_aside_if_damaged(backup.folder, "checkpoint") == "abc123"
    assert not backup.folder.exists() and len(list((tmp_path / ".damaged").iterdir())) == 1, "kept for a look"
    assert set_aside_if_damaged(backup.folder, "checkpoint") is None, "nothing left to set aside: a fresh start"


def test_a_history_shorter_than_the_checkpoint_is_damage(tmp_path):
    backup = RunBackup(tmp_path / "run" / "key")
    fitted(backup, "checkpoint", epochs=2)
    backup = RunBackup(backup.folder).load()
    backup.save(history=backup.history[:1])
    assert checkpoint_damage(RunBackup(backup.folder).load(), "checkpoint") == (
        "its checkpoint finished 2 epoch(s) but state.json's history has 1")
