"""Thread pools and logical CPU devices (``runtime:``): sized for the replicas a process holds, first thing.

Strategies that want several replicas (or layer stages) on a CPU split it
into logical devices; the thread pools follow the model kind's record and the
CPUs this process may run on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tfdist.errors import StrategyError
from tfdist.hardware import usable_cpus
from tfdist.model_kinds import model_kind as model_kind_of
from tfdist.runtime.loading import tensorflow
from tfdist.runtime.onednn import configure_onednn

if TYPE_CHECKING:
    from tfdist.config.knobs import Config

log = logging.getLogger(__name__)


def configure_cpu_devices(count: int) -> list[str]:
    """Split the CPU into ``count`` logical devices, unless GPUs are present.

    Must run before TensorFlow executes its first op; afterwards the device
    list is frozen. Returns the device names replicas should use.

    Raises:
        StrategyError: the runtime is already initialised with another split.
    """
    tf = tensorflow()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return [f"/gpu:{i}" for i in range(len(gpus))]
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if (len(current) if current else 1) != count:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
            )
        except RuntimeError:
            have = len(tf.config.list_logical_devices("CPU"))
            raise StrategyError(
                f"cannot split the CPU into {count} devices: TensorFlow already runs with {have}; "
                "configure devices before any TensorFlow op runs"
            ) from None
    return [f"/cpu:{i}" for i in range(count)]


def intra_op_threads(intra_op: int | str, model_kind: str, replicas: int) -> int:
    """The threads one op may use in a training process: ``runtime.intra_op_threads`` as set, ``auto`` resolved.

    ``auto`` (``runtime.intra_op_threads``) is what the kind's record says: 1
    for a model whose ops are too small to split across cores, else the CPUs
    this process may use shared among its ``replicas``, as convolutions split
    well (docs/performance.md, "Fair baselines: threads per op"). So normal
    training gets every core a distributed run on the same machine uses, and a
    pinned task of one core gets 1.
    """
    if intra_op != "auto":
        return int(intra_op)
    return 1 if model_kind_of(model_kind).threads_per_op == "one" else max(1, len(usable_cpus()) // max(1, replicas))


def op_threads(config: Config, replicas: int = 1) -> tuple[int, int]:
    """The (intra, inter) op threads of a training process of ``config`` holding ``replicas`` replicas: ``runtime:``,
    ``auto`` resolved (:func:`intra_op_threads`)."""
    return (intra_op_threads(config.runtime.intra_op_threads, config.model.kind, replicas),
            config.runtime.inter_op_threads)


def configure_runtime(config: Config, replicas: int = 1) -> None:
    """All of ``runtime:`` in a training process of ``replicas`` replicas, first thing: oneDNN, then the thread pools."""
    configure_onednn(config.runtime.onednn, config.model.kind, config.train.precision)
    configure_threads(*op_threads(config, replicas))


def configure_threads(intra_op: int, inter_op: int) -> None:
    """Set TensorFlow's thread pools (0 leaves TensorFlow's choice); first thing in the process.

    ``inter_op`` is capped at the CPUs this process may run on: a task pinned
    to one core (``distributed.pin_tasks``) runs its ops one at a time anyway,
    and a second thread only contends for that core (docs/performance.md,
    "The multi-process step").

    Once TensorFlow's runtime has started the pools are fixed: then this only
    warns, so a library caller (a notebook, the tests) keeps working.
    """
    tf = tensorflow()
    usable = len(usable_cpus())
    if inter_op > usable:
        log.info("%d inter-op thread(s), not %d: this process may run on %d CPU(s)", usable, inter_op, usable)
        inter_op = usable
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError:
        current = (tf.config.threading.get_intra_op_parallelism_threads(),
                   tf.config.threading.get_inter_op_parallelism_threads())
        if current != (intra_op, inter_op):
            log.warning("TensorFlow already runs with (intra, inter) op threads %s; runtime settings %s not applied",
                        current, (intra_op, inter_op))

#: The fewest inter-op threads a cluster server's compute pool gets: a parameter_server worker runs each scheduled
#: function on that pool while the function's own receives and its dataset's map wait for a thread of the same pool.
#: With TensorFlow's default there, a thread per CPU the process may use, a worker restricted to one CPU never finished
#: its first scheduled steps (TF 2.21; docs/performance/parallelism.md, 8c).
SERVER_MIN_INTER_OP_THREADS = 2


def server_config(intra_op: int) -> Any:
    """The session config of a cluster server (``tf.distribute.Server``): ``intra_op`` threads per op (0: TensorFlow's
    choice), and TensorFlow's inter-op pool but never fewer than :data:`SERVER_MIN_INTER_OP_THREADS` threads, so
    that a server pinned to one CPU keeps running.

    A server's pools are its own: :func:`configure_threads` sets the process's
    eager context, which the functions a coordinator sends it do not run in.
    The mlp's one thread per op on the ps too: a worker's step measured
    faster in 5 of 5 alternated rounds (docs/performance/parallelism.md, 8c).
    """
    inter_op = max(SERVER_MIN_INTER_OP_THREADS, len(usable_cpus()))
    return tensorflow().compat.v1.ConfigProto(intra_op_parallelism_threads=intra_op, inter_op_parallelism_threads=inter_op)
