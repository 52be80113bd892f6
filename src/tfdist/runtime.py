"""How this process's TensorFlow runtime uses the machine: oneDNN, thread pools and logical CPU devices.

All are fixed once TensorFlow runs its first op, so a training process
sets them first thing: ``runtime:`` in params.yaml turns oneDNN on or off and sizes the thread pools,
and strategies that want several replicas (or layer stages) on a CPU split
it into logical devices.

TensorFlow is imported lazily, on the first call: a stage must report a bad
param in well under a second, before TensorFlow's seconds-long import.
"""

from __future__ import annotations

import ctypes.util
import importlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfdist.errors import InputError, StrategyError
from tfdist.hardware import usable_cpus
from tfdist.model_kinds import model_kind as model_kind_of
from tfdist.native_logs import exec_program

if TYPE_CHECKING:
    from tfdist.config.knobs import Config

log = logging.getLogger(__name__)


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


#: Each allocator ``runtime.allocator`` can preload: the name ``ctypes.util.find_library`` knows it by, and its
#: Debian package.
ALLOCATOR_LIBRARIES = {"jemalloc": ("jemalloc", "libjemalloc2"), "tcmalloc": ("tcmalloc_minimal", "libtcmalloc-minimal4")}
#: Set in the environment of a process this module re-executed, so that a preload that did not take is not retried.
_REEXECUTED = "TFDIST_ALLOCATOR_PRELOADED"


def allocator_library(setting: str, kind: str) -> tuple[str, str | None]:
    """The allocator ``runtime.allocator`` resolves to here for model ``kind``, and the library to preload (None:
    glibc's malloc). ``auto`` preloads one only for a kind whose record says it gains (``preloads_allocator``).

    Raises:
        InputError: a named allocator that is not installed.
    """
    if setting == "system" or (setting == "auto" and not model_kind_of(kind).preloads_allocator):
        return "system", None
    for name in (ALLOCATOR_LIBRARIES if setting == "auto" else (setting,)):
        soname, package = ALLOCATOR_LIBRARIES[name]
        if found := ctypes.util.find_library(soname):
            return name, found
        if setting != "auto":
            raise InputError(f"runtime.allocator {setting}: lib{soname} is not installed here; install Debian's "
                             f"{package} (make install does) or set runtime.allocator: auto")
    return "system", None


def allocator_in_use() -> str:
    """The allocator this process runs with: a preloadable one mapped into it, else ``system``."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "system"
    return next((name for name, (soname, _) in ALLOCATOR_LIBRARIES.items() if f"lib{soname}" in maps), "system")


def run_under_allocator(setting: str, kind: str) -> None:
    """Re-execute this process with ``runtime.allocator``'s library for model ``kind`` preloaded, unless it runs
    with it already.

    A training process calls it before it does anything else (no file written,
    TensorFlow not loaded): ``LD_PRELOAD`` only takes effect when a program
    starts. Its children (a local cluster's tasks) inherit the preload. glibc's
    malloc returns the large buffers TensorFlow's gRPC exchanges allocate to the
    kernel and faults them in again every step; jemalloc and tcmalloc keep them
    (docs/performance/parallelism.md 8b).
    """
    name, library = allocator_library(setting, kind)
    if library is None or allocator_in_use() == name:
        return
    if os.environ.get(_REEXECUTED):
        log.warning("runtime.allocator %s: %s was preloaded but is not in use; running with glibc's malloc", setting,
                    library)
        return
    os.environ["LD_PRELOAD"] = " ".join(filter(None, (library, os.environ.get("LD_PRELOAD"))))
    os.environ[_REEXECUTED] = "1"
    exec_program(sys.executable, [sys.executable, *sys.orig_argv[1:]])
