"""oneDNN on or off (``runtime.onednn``): TensorFlow reads the switch once, before its first op."""

from __future__ import annotations

import logging
import os
import sys

from tfdist.model_kinds import model_kind as model_kind_of

log = logging.getLogger(__name__)

#: TensorFlow reads it once, when it first asks whether oneDNN is on (its ops' kernels and graph rewrites).
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"

#: Precisions whose fast CPU kernels are oneDNN's: without it TensorFlow emulates bfloat16 even on a CPU with a unit.
ONEDNN_PRECISIONS = ("mixed_bfloat16",)


def onednn_enabled(setting: str, model_kind: str, precision: str = "float32") -> bool | None:
    """Whether ``runtime.onednn`` turns oneDNN on for ``model_kind`` in ``precision``; None leaves it to TensorFlow.

    ``auto`` follows the kind's record (on for the kinds oneDNN speeds up, a
    convnet's convolutions; off for the mlp, whose float32 results then
    stay those of earlier runs, as oneDNN rounds differently), and is on for a
    precision only oneDNN computes fast (:data:`ONEDNN_PRECISIONS`).
    docs/performance.md, "oneDNN" and "Precision and loop".
    """
    if setting == "tensorflow":
        return None
    if setting == "auto":
        return model_kind_of(model_kind).onednn or precision in ONEDNN_PRECISIONS
    return setting == "enabled"


def configure_onednn(setting: str, model_kind: str, precision: str = "float32") -> None:
    """Turn TensorFlow's oneDNN kernels on or off as ``runtime.onednn`` says for the model; before TensorFlow loads.

    ``tensorflow`` leaves the environment (and TensorFlow's default) alone.
    After TensorFlow has loaded this only warns when the setting differs:
    the variable is read once per process.
    """
    enabled = onednn_enabled(setting, model_kind, precision)
    if enabled is None:
        return
    wanted = "1" if enabled else "0"
    if "tensorflow" in sys.modules:
        if os.environ.get(ONEDNN_ENV) != wanted:
            log.warning("TensorFlow is already loaded with %s=%s; runtime.onednn %s not applied", ONEDNN_ENV,
                        os.environ.get(ONEDNN_ENV, "unset"), setting)
        return
    os.environ[ONEDNN_ENV] = wanted
