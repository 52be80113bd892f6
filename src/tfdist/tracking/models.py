"""Models: saved as MLflow model folders, logged and registered with the run, checked, loaded, and the champion.

TensorFlow is imported only by the functions that save or load a model.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow.models import infer_signature

from tfdist.errors import InputError
from tfdist.tracking.outage import Patience

log = logging.getLogger(__name__)


def _pip_requirements() -> list[str]:
    # Given explicitly: MLflow's own inference imports the model and takes seconds.
    from tfdist.tf_imports import keras, tf

    return [f"tensorflow=={tf.__version__}", f"tf-keras=={keras.__version__}", f"mlflow=={mlflow.__version__}"]


def _model_kwargs(model: Any, example: Any) -> dict[str, Any]:
    return {
        "signature": infer_signature(example, model.predict(example, verbose=0)),
        "input_example": example,
        "pip_requirements": _pip_requirements(),
    }


@dataclass(frozen=True)
class SavedModel:
    """A model saved in its folder, with what logging it again needs (its signature, computed once)."""

    model: Any
    path: Path
    kwargs: dict[str, Any]


def save_model(model: Any, path: Path, *, example: Any) -> SavedModel:
    """Save ``model`` as an MLflow model folder at ``path`` (loadable by evaluate and pyfunc).

    The signature (one prediction of ``example``) is computed here, once, for
    :func:`log_model` too.
    """
    import mlflow.tensorflow  # imports TensorFlow: only where a model is saved

    # MLflow validates the input example with a Keras predict that draws a progress bar on stdout.
    with contextlib.redirect_stdout(io.StringIO()):
        kwargs = _model_kwargs(model, example)
        mlflow.tensorflow.save_model(model, str(path), **kwargs)
    return SavedModel(model, path, kwargs)


def log_model(saved: SavedModel, *, register_as: str | None, patience: Patience) -> str | None:
    """Log ``saved`` to the active run as ``model`` (waiting within ``patience``); with ``register_as``, its version.

    With ``register_as`` the logged model becomes a new version of that
    registered model. Whether the run holds its model already (a rerun) is
    the caller's to ask first (:func:`tfdist.resume.rerun.logged_model`).
    """
    import mlflow.tensorflow

    with contextlib.redirect_stdout(io.StringIO()):
        info = patience.call(lambda: mlflow.tensorflow.log_model(
            saved.model, name="model", registered_model_name=register_as, **saved.kwargs), "the model")
    version = info.registered_model_version
    return None if version is None else str(version)


def tag_version(register_as: str, version: str, tags: Mapping[str, str], patience: Patience) -> None:
    """Tag version ``version`` of registered model ``register_as`` (waiting within ``patience``)."""
    client = mlflow.MlflowClient()
    for key, value in tags.items():
        patience.call(functools.partial(client.set_model_version_tag, register_as, version, key, str(value)),
                      "the model version's tags")
    log.info("registered the model as %s version %s", register_as, version)


#: The alias the compare stage moves to the best registered version: models:/<name>@champion loads it.
CHAMPION_ALIAS = "champion"


def set_champion(registered_model: str, run_ids: list[str]) -> str | None:
    """Point ``registered_model@champion`` at the version logged by the first of ``run_ids`` that has one.

    ``run_ids`` come best first. Returns the version, or None when none of
    the runs registered a model (``mlflow.register_models`` was off).
    """
    client = mlflow.MlflowClient()
    for run_id in run_ids:
        versions = client.search_model_versions(f"name = '{registered_model}' and run_id = '{run_id}'")
        if versions:
            version = max(versions, key=lambda v: int(v.version)).version
            client.set_registered_model_alias(registered_model, CHAMPION_ALIAS, version)
            log.info("models:/%s@%s is version %s", registered_model, CHAMPION_ALIAS, version)
            return str(version)
    return None


def check_model(path: Path) -> None:
    """Refuse a folder that holds no model :func:`save_model` saved.

    Raises:
        InputError: the folder is missing or is not an MLflow model.
    """
    if not (Path(path) / "MLmodel").is_file():
        raise InputError(f"{path} is not a saved model (no MLmodel file); run the train stage first")


#: MLflow's own switch for unpickling what a model folder holds; tfdist reads it as off unless set to true.
PICKLE_ENV = "MLFLOW_ALLOW_PICKLE_DESERIALIZATION"


def load_model(path: Path) -> Any:
    """Load a Keras model saved by :func:`save_model`, without unpickling anything it holds.

    MLflow's Keras flavour saves the process's registered custom objects as a
    cloudpickle file beside the model and unpickles it on load, by default: a
    model folder pulled from a shared remote or store could run code as it
    loads. tfdist's models need none of it (tf_keras registers its own objects
    as it is imported), so the ``.keras`` file is read in Keras's safe mode,
    which refuses serialised Python code too. ``MLFLOW_ALLOW_PICKLE_DESERIALIZATION=true``
    loads through MLflow as before, for a model whose builder needs its custom objects.

    Raises:
        InputError: the folder is missing, is not an MLflow model, or its files are damaged.
    """
    check_model(path)
    pickle_allowed = os.environ.get(PICKLE_ENV, "").strip().lower() == "true"
    keras_file = Path(path) / "data" / "model.keras"
    if not pickle_allowed and not keras_file.is_file():
        raise InputError(f"{path} holds no model.keras to load safely; a model from elsewhere loads only with "
                         f"{PICKLE_ENV}=true, which may run code it holds")
    try:
        if pickle_allowed:
            import mlflow.tensorflow  # imports TensorFlow: only where a model is loaded

            return mlflow.tensorflow.load_model(str(path))
        from tfdist.tf_imports import keras  # imports TensorFlow: only where a model is loaded

        return keras.models.load_model(str(keras_file), safe_mode=True)
    except Exception as err:  # noqa: BLE001  Keras, h5py and MLflow each raise their own for a damaged file
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"{path} holds a damaged model ({reason}); bring it back with dvc checkout {path}, "
                         "or train it again") from None
