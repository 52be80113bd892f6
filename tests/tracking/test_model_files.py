"""A model folder from a shared remote is data, not code: loading it unpickles nothing unless the user says so."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tfdist.errors import InputError
from tfdist.tracking.models import PICKLE_ENV, load_model, save_model


class Planted:
    """Unpickled, it leaves a file behind: the proof that loading ran code."""

    def __init__(self, proof: str):
        self.proof = proof

    def __reduce__(self):
        return (open, (self.proof, "w"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from tfdist.tf_imports import keras

    model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    folder = tmp_path_factory.mktemp("model") / "normal"
    save_model(model, folder, example=np.zeros((2, 4), dtype=np.float32))
    return folder, model


def test_a_planted_pickle_is_not_run_and_the_model_still_loads(saved, tmp_path, monkeypatch):
    folder, model = saved
    proof = tmp_path / "ran"
    for name in ("global_custom_objects.cloudpickle", "custom_objects.cloudpickle"):
        (folder / "data" / name).write_bytes(pickle.dumps(Planted(str(proof))))
    monkeypatch.delenv(PICKLE_ENV, raising=False)
    loaded = load_model(folder)
    assert not proof.exists(), "loading the model unpickled what its folder held"
    for mine, theirs in zip(model.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    monkeypatch.setenv(PICKLE_ENV, "true")  # the user's own choice: MLflow's loader, pickles and all
    with pytest.raises(InputError, match="holds a damaged model"):  # the planted object is no dict of objects
        load_model(folder)
    assert proof.exists(), "the probe would see a pickle run"


def test_a_model_without_its_keras_file_is_refused_unless_pickles_are_allowed(saved, tmp_path, monkeypatch):
    import shutil

    folder = shutil.copytree(saved[0], tmp_path / "other")
    (folder / "data" / "model.keras").unlink()
    monkeypatch.delenv(PICKLE_ENV, raising=False)
    with pytest.raises(InputError, match=f"holds no model.keras to load safely; .* only with {PICKLE_ENV}=true"):
        load_model(folder)
