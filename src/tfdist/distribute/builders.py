"""The ``tf.distribute`` strategies themselves, built from a registry record and plain values.

Each builder takes the device count, this process's cluster task (if any)
and ``distributed.all_reduce`` as plain values, never a config object (as
Model Garden's ``distribute_utils`` does), and is chosen by the record's
``tf_strategy``: adding a strategy is one record in
:mod:`tfdist.distribute.registry` and, for a new TensorFlow API, one builder here.

TensorFlow is imported lazily, on the first build.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tfdist.distribute.cluster_spec import ClusterTask
from tfdist.distribute.registry import StrategySpec
from tfdist.errors import StrategyError
from tfdist.runtime.loading import tensorflow
from tfdist.runtime.threads import configure_cpu_devices
from tfdist.tf_private import configure_collective_coordination

if TYPE_CHECKING:
    import tensorflow as tf

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StrategyInfo:
    """What a strategy resolved to, for logs, reports and MLflow.

    Attributes:
        name: the requested name.
        strategy_class: the TensorFlow class it became.
        replicas: replicas in sync (batches computed per step).
        devices: device names the replicas run on (task names for multi-process runs).
        workers: worker processes taking part.
        ps: parameter server processes.
        synchronous: whether all replicas apply each update together.
    """

    name: str
    strategy_class: str
    replicas: int
    devices: list[str] = field(default_factory=list)
    workers: int = 1
    ps: int = 0
    synchronous: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Built:
    """What a builder made: the strategy, the devices (or tasks) its replicas use, the processes taking part."""

    strategy: Any
    devices: list[str]
    workers: int = 1
    ps: int = 0


#: (strategy name, devices, cluster task, all-reduce) -> what was built.
_Builder = Callable[[str, int, "ClusterTask | None", str], _Built]


def build_strategy(spec: StrategySpec, devices: int = 2, task: ClusterTask | None = None,
                   all_reduce: str = "auto", heartbeat_timeout: float | None = None
                   ) -> tuple[tf.distribute.Strategy, StrategyInfo]:
    """The TensorFlow strategy of ``spec``, made first thing in the process (logical devices freeze after the first op).

    Args:
        spec: the strategy's record.
        devices: logical CPU devices to split this machine into, where the strategy
            takes several devices and there is no GPU.
        task: this process's task in a cluster, for the multi-process strategies;
            MultiWorkerMirrored without one runs as a single worker, ParameterServer needs one.
        all_reduce: multi_worker_mirrored's all-reduce (``auto``, ``ring``, ``nccl``).
        heartbeat_timeout: seconds a synchronous cluster's coordination service waits for a silent
            task before it calls it lost (``distributed.heartbeat_timeout``; None: TensorFlow's).

    Raises:
        StrategyError: the strategy needs hardware or a cluster that is absent.
    """
    if spec.splits_layers:
        # No tf.distribute strategy splits a model: the default strategy holds it, and the
        # model places its layers on these devices itself (tfdist.distribute.placement).
        names = configure_cpu_devices(devices)
        strategy = tensorflow().distribute.get_strategy()
        info = StrategyInfo(spec.name, f"{type(strategy).__name__} + layers on devices", 1, names, 1, 0,
                            spec.synchronous)
        log.info("strategy %s: the model's layers on %s", spec.name, ", ".join(names))
        return strategy, info
    if task is not None and spec.multi_process and spec.synchronous:
        built = _joined(spec, devices, task, all_reduce, heartbeat_timeout)
    else:
        built = BUILDERS[spec.tf_strategy](spec.name, devices, task, all_reduce)
    info = StrategyInfo(spec.name, type(built.strategy).__name__, built.strategy.num_replicas_in_sync, built.devices,
                        built.workers, built.ps, spec.synchronous)
    log.info("strategy %s: %d replica(s) on %s", spec.name, info.replicas, ", ".join(info.devices))
    return built.strategy, info


def _joined(spec: StrategySpec, devices: int, task: ClusterTask, all_reduce: str, heartbeat_timeout: float | None
            ) -> _Built:
    """Build a synchronous multi-process strategy: join its cluster, with the stage's signal handlers kept.

    Joining a multi_worker_mirrored cluster is one C++ call during which no Python signal
    handler runs: SIGTERM and Ctrl-C act as the kernel's defaults meanwhile (the process ends
    at once; no run is open yet). Joining also installs TensorFlow's SIGTERM preemption
    notifier, which would swallow the signal: the stage's handlers are put back after it, so a
    stop while training unwinds (the run ends KILLED) and the peers report it lost.
    """
    interrupt = signal.signal(signal.SIGINT, signal.SIG_DFL)
    terminate = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if heartbeat_timeout is not None:
        configure_collective_coordination(dict(task.cluster), heartbeat_timeout)
    built = BUILDERS[spec.tf_strategy](spec.name, devices, task, all_reduce)
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, terminate)
    return built


def _first_device() -> str:
    return "/gpu:0" if tensorflow().config.list_physical_devices("GPU") else "/cpu:0"


def _resolver(task: ClusterTask) -> Any:
    """TensorFlow's cluster resolver for this process's task."""
    tf = tensorflow()
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(dict(task.cluster)), task_type=task.task_type, task_id=task.task_index, rpc_layer="grpc",
    )


def _default(name: str, devices: int, task: ClusterTask | None, all_reduce: str) -> _Built:
    return _Built(tensorflow().distribute.get_strategy(), [_first_device()])


def _one_device(name: str, devices: int, task: ClusterTask | None, all_reduce: str) -> _Built:
    device = _first_device()
    return _Built(tensorflow().distribute.OneDeviceStrategy(device), [device])


def _mirrored(name: str, devices: int, task: ClusterTask | None, all_reduce: str) -> _Built:
    tf = tensorflow()
    names = configure_cpu_devices(devices)
    # NCCL all-reduce exists only between GPUs; on CPUs reduce through one device.
    on_cpus = all("cpu" in d for d in names)
    cross_device_ops = tf.distribute.ReductionToOneDevice(reduce_to_device="/cpu:0") if on_cpus else None
    return _Built(tf.distribute.MirroredStrategy(names, cross_device_ops=cross_device_ops), names)


def _central_storage(name: str, devices: int, task: ClusterTask | None, all_reduce: str) -> _Built:
    names = configure_cpu_devices(devices)
    return _Built(tensorflow().distribute.experimental.CentralStorageStrategy(names, parameter_device="/cpu:0"), names)


def _multi_worker_mirrored(name: str, devices: int, task: ClusterTask | None, all_reduce: str) -> _Built:
    # Every worker process contributes its local device(s): one CPU, or its GPUs.
    # AUTO picks ring collectives on CPUs and NCCL between GPUs; NCCL needs GPUs on every worker.
    tf = tensorflow()
    if all_reduce == "nccl" and not tf.config.list_physical_devices("GPU"):
        raise StrategyError("distributed.all_reduce nccl needs a GPU on every worker (NCCL runs between GPUs), "
                            "and this machine has none; use auto or ring")
    implementation = tf.distribute.experimental.CommunicationImplementation
    options = tf.distribute.experimental.CommunicationOptions(implementation=getattr(implementation, all_reduce.upper()))
    kwargs = {"cluster_resolver": _resolver(task)} if task is not None else {}
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options, **kwargs)
    tasks = [f"/job:{job}/task:{i}" for job in ("chief", "worker") for i in range(task.count(job) if task else 0)]
    tasks = tasks or ["/job:localhost/task:0"]
    return _Built(strategy, tasks, workers=len(tasks))


def _parameter_server(name: str, devices: int, task: ClusterTask | None, all_reduce: str) -> _Built:
    # Each worker runs whole steps on its own and pushes its updates to the
    # parameter servers without waiting for the others: asynchronous training.
    # num_replicas_in_sync is the replicas *per worker* (1 on a CPU worker), so a
    # step's global batch is batch_size x that, whatever the number of workers.
    if task is None:
        raise StrategyError(
            f"strategy '{name}' needs a cluster with chief, worker and ps tasks; "
            "set TF_CONFIG or let the train stage launch one locally"
        )
    strategy = tensorflow().distribute.ParameterServerStrategy(_resolver(task))
    workers = [f"/job:worker/task:{i}" for i in range(task.count("worker"))]
    return _Built(strategy, workers, workers=len(workers), ps=task.count("ps"))


def _tpu(name: str, devices: int, task: ClusterTask | None, all_reduce: str) -> _Built:
    tf = tensorflow()
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as err:
        raise StrategyError(
            f"strategy '{name}' needs a TPU, and none was found ({str(err).splitlines()[0]}); "
            "run on a TPU VM or choose mirrored"
        ) from None
    return _Built(tf.distribute.TPUStrategy(resolver), [d.name for d in tf.config.list_logical_devices("TPU")])


#: A builder per ``tf.distribute`` API a record's ``tf_strategy`` names.
BUILDERS: dict[str, _Builder] = {
    "get_strategy": _default,
    "OneDeviceStrategy": _one_device,
    "MirroredStrategy": _mirrored,
    "CentralStorageStrategy": _central_storage,
    "MultiWorkerMirroredStrategy": _multi_worker_mirrored,
    "ParameterServerStrategy": _parameter_server,
    "TPUStrategy": _tpu,
}
