"""TensorFlow imported lazily, on the first call: a stage must report a bad param in well under a second, before
TensorFlow's seconds-long import; and, for a process that builds no model, without tf_keras."""

from __future__ import annotations

import importlib
import sys
from typing import Any


def tensorflow() -> Any:
    """TensorFlow, imported on first use: it takes seconds (the package init selected Keras 2)."""
    return importlib.import_module("tensorflow")

#: What TensorFlow's package init imports of Keras eagerly (its optimizers, for SavedModel's registry), and
#: with it the whole of tf_keras.
_KERAS_EAGER_IMPORT = "tf_keras.src.optimizers"


def tensorflow_without_keras() -> Any:
    """TensorFlow, imported without tf_keras: for a process that builds no model (a parameter_server server).

    TensorFlow's package init imports tf_keras's optimizers, and so all of
    tf_keras (applications, datasets, pandas through its data adapter), about
    a quarter of a server's start (docs/performance.md, "Start-up"). The init
    skips them when they raise ImportError, which Python's import does for a
    module whose ``sys.modules`` entry is None. The entry is removed once
    TensorFlow is loaded, so tf_keras stays importable in full. Once TensorFlow
    is imported, this is :func:`tensorflow`.
    """
    if "tensorflow" in sys.modules or _KERAS_EAGER_IMPORT in sys.modules:
        return tensorflow()
    sys.modules[_KERAS_EAGER_IMPORT] = None  # type: ignore[assignment]
    try:
        return tensorflow()
    finally:
        if sys.modules.get(_KERAS_EAGER_IMPORT, 0) is None:
            del sys.modules[_KERAS_EAGER_IMPORT]
