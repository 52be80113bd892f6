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

from tfdist.tf_imports import tf

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


def configure_collective_coordination(cluster: dict[str, list[str]], heartbeat_timeout: float) -> None:
    """Configure TensorFlow's coordination service as MultiWorkerMirroredStrategy does, with our heartbeat timeout.

    MultiWorkerMirroredStrategy sets the service up itself (chief and worker
    jobs, led by the chief or worker 0) only when nothing has yet, and with
    TensorFlow's fixed heartbeat timeout; configured first, it keeps ours.
    Call before the strategy is built.
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util

    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(cluster[job]))
            for job in ("chief", "worker") if job in cluster]
    _eager_context.context().configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(cluster),
        coordinated_jobs=jobs, heartbeat_timeout_in_ms=int(heartbeat_timeout * 1000))
