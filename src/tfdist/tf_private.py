"""Every TensorFlow and tf_keras API tfdist uses that is private or experimental-internal.

Kept in one place so that a TensorFlow upgrade that moves or drops one breaks
here, loudly, in ``tests/test_tf_private.py``, instead of somewhere deep in a
stage run. Nothing else in tfdist reaches into ``tensorflow.python`` or
``tf.__internal__``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from tensorflow.python.eager import context as _eager_context

from tfdist.runtime import tf

#: Decorates a Keras layer/model method whose attribute assignments must not be
#: tracked as dependencies (so they are neither weights nor saved).
untracked: Callable[[Callable[..., Any]], Callable[..., Any]] = tf.__internal__.tracking.no_automatic_dependency_tracking


def reset_eager_context() -> None:
    """Drop this process's eager context, and with it its connections to remote tasks.

    A parameter_server coordinator calls it before its workers are stopped:
    otherwise TensorFlow deletes its functions on the (stopped) workers at
    interpreter exit and prints dozens of gRPC errors.
    """
    gc.collect()
    _eager_context._reset_context()


def create_optimizer_slots(optimizer: Any, variables: list[Any]) -> None:
    """Create a tf_keras legacy optimizer's slot variables (Adam's moments...) for ``variables`` now.

    The legacy optimizers (and their LossScaleOptimizer wrapper) create them on the first
    ``apply_gradients``; the newer ones have a public ``build`` for it.
    """
    build = getattr(optimizer, "build", None)
    if build is not None:
        build(variables)
    else:
        optimizer._create_all_weights(variables)


def tracing_count(function: Any) -> int:
    """How often a ``tf.function`` was traced (0 for anything else, or one never called)."""
    count = getattr(function, "experimental_get_tracing_count", None)
    return int(count()) if count else 0
