"""One factory from a strategy name to a ``tf.distribute`` strategy.

Also splits the CPU into logical devices when there is no GPU, so that
Mirrored and CentralStorage run several replicas on one machine. Imports
nothing else of tfdist; TensorFlow is imported on first use, so the names
and errors here cost nothing to import.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tensorflow as tf

log = logging.getLogger(__name__)

#: Names ``make_strategy`` accepts. ``default`` is no distribution at all.
STRATEGY_NAMES = (
    "default", "one_device", "mirrored", "central_storage", "multi_worker_mirrored", "parameter_server", "tpu",
)
#: Strategies whose replicas live in several processes, joined through a cluster spec (TF_CONFIG).
MULTI_PROCESS_STRATEGIES = ("multi_worker_mirrored", "parameter_server")


class StrategyError(ValueError):
    """An unknown strategy name, or one this machine cannot run (exit 2)."""


@dataclass(frozen=True)
class StrategyInfo:
    """What a strategy resolved to, for logs, reports and MLflow.

    Attributes:
        name: the requested name.
        strategy_class: the TensorFlow class it became.
        replicas: replicas in sync (batches computed per step).
        devices: device names the replicas run on.
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


def _tensorflow() -> Any:
    """TensorFlow, imported on first use: it takes seconds (the package init selected Keras 2)."""
    return importlib.import_module("tensorflow")


def configure_cpu_devices(count: int) -> list[str]:
    """Split the CPU into ``count`` logical devices, unless GPUs are present.

    Must run before TensorFlow executes its first op; afterwards the device
    list is frozen. Returns the device names replicas should use.

    Raises:
        StrategyError: the runtime is already initialised with another split.
    """
    tf = _tensorflow()
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


def configure_threads(intra_op: int, inter_op: int) -> None:
    """Set TensorFlow's thread pools (0 leaves TensorFlow's choice); first thing in the process.

    Once TensorFlow's runtime has started the pools are fixed: then this only
    warns, so a library caller (a notebook, the tests) keeps working.
    """
    tf = _tensorflow()
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError:
        current = (tf.config.threading.get_intra_op_parallelism_threads(),
                   tf.config.threading.get_inter_op_parallelism_threads())
        if current != (intra_op, inter_op):
            log.warning("TensorFlow already runs with (intra, inter) op threads %s; runtime settings %s not applied",
                        current, (intra_op, inter_op))


def check_strategy_name(name: Any) -> str:
    """``name`` lower-cased if it is a known strategy.

    Raises:
        StrategyError: naming the value and the choices (YAML may turn ``off`` into
            ``False``: non-strings are refused too).
    """
    if not isinstance(name, str) or name.lower() not in STRATEGY_NAMES:
        raise StrategyError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGY_NAMES)}")
    return name.lower()


def make_strategy(
    name: Any, devices: int = 2, cluster_resolver: Any = None
) -> tuple[tf.distribute.Strategy, StrategyInfo]:
    """Build the strategy called ``name``.

    Args:
        name: one of :data:`STRATEGY_NAMES`.
        devices: logical CPU devices for Mirrored/CentralStorage when no GPU exists.
        cluster_resolver: where the other processes are, for the strategies in
            :data:`MULTI_PROCESS_STRATEGIES`; MultiWorkerMirrored without one runs
            as a single worker, ParameterServer needs one.

    Raises:
        StrategyError: ``name`` is not a known strategy, or needs hardware or a
            cluster that is absent.
    """
    name = check_strategy_name(name)
    tf = _tensorflow()
    if name == "default":
        strategy = tf.distribute.get_strategy()
        return strategy, StrategyInfo(name, type(strategy).__name__, 1, [_first_device()])
    if name == "tpu":
        return _make_tpu()
    if name == "multi_worker_mirrored":
        return _make_multi_worker(cluster_resolver)
    if name == "parameter_server":
        return _make_parameter_server(cluster_resolver)
    if name == "one_device":
        device_names = [_first_device()]
        strategy = tf.distribute.OneDeviceStrategy(device_names[0])
    elif name == "mirrored":
        device_names = configure_cpu_devices(devices)
        strategy = tf.distribute.MirroredStrategy(device_names, cross_device_ops=_cross_device_ops(device_names))
    else:
        device_names = configure_cpu_devices(devices)
        strategy = tf.distribute.experimental.CentralStorageStrategy(device_names, parameter_device="/cpu:0")
    info = StrategyInfo(name, type(strategy).__name__, strategy.num_replicas_in_sync, list(device_names))
    log.info("strategy %s: %d replica(s) on %s", name, info.replicas, ", ".join(info.devices))
    return strategy, info


def _make_multi_worker(resolver: Any) -> tuple[tf.distribute.Strategy, StrategyInfo]:
    # Every worker process contributes its local device(s): one CPU, or its GPUs.
    # RING collectives work on CPUs; NCCL would need GPUs on every worker.
    tf = _tensorflow()
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.AUTO
        if tf.config.list_physical_devices("GPU") else tf.distribute.experimental.CommunicationImplementation.RING
    )
    kwargs = {"cluster_resolver": resolver} if resolver is not None else {}
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options, **kwargs)
    jobs = resolver.cluster_spec().as_dict() if resolver is not None else {}
    tasks = [f"/job:{job}/task:{i}" for job in ("chief", "worker") for i in range(len(jobs.get(job, [])))]
    tasks = tasks or ["/job:localhost/task:0"]
    info = StrategyInfo("multi_worker_mirrored", type(strategy).__name__, strategy.num_replicas_in_sync, tasks, len(tasks))
    log.info("strategy multi_worker_mirrored: %d replica(s) across %d worker(s)", info.replicas, info.workers)
    return strategy, info


def _make_parameter_server(resolver: Any) -> tuple[tf.distribute.Strategy, StrategyInfo]:
    # Each worker runs whole steps on its own and pushes its updates to the
    # parameter servers without waiting for the others: asynchronous training.
    # num_replicas_in_sync is the replicas *per worker* (1 on a CPU worker), so a
    # step's global batch is batch_size x that, whatever the number of workers.
    if resolver is None:
        raise StrategyError(
            "strategy 'parameter_server' needs a cluster with chief, worker and ps tasks; "
            "set TF_CONFIG or let the train stage launch one locally"
        )
    tf = _tensorflow()
    jobs = resolver.cluster_spec().as_dict()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    workers, ps = len(jobs.get("worker", [])), len(jobs.get("ps", []))
    tasks = [f"/job:worker/task:{i}" for i in range(workers)]
    info = StrategyInfo(
        "parameter_server", type(strategy).__name__, strategy.num_replicas_in_sync, tasks, workers, ps, synchronous=False
    )
    log.info("strategy parameter_server: %d worker(s), %d ps, asynchronous", workers, ps)
    return strategy, info


def _first_device() -> str:
    tf = _tensorflow()
    return "/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0"


def _cross_device_ops(device_names: list[str]) -> tf.distribute.CrossDeviceOps | None:
    # NCCL all-reduce exists only between GPUs; on CPUs reduce through one device.
    if all("cpu" in d for d in device_names):
        return _tensorflow().distribute.ReductionToOneDevice(reduce_to_device="/cpu:0")
    return None


def _make_tpu() -> tuple[tf.distribute.Strategy, StrategyInfo]:
    tf = _tensorflow()
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as err:
        raise StrategyError(
            f"strategy 'tpu' needs a TPU, and none was found ({str(err).splitlines()[0]}); "
            "run on a TPU VM or choose mirrored"
        ) from None
    strategy = tf.distribute.TPUStrategy(resolver)
    devices = [d.name for d in tf.config.list_logical_devices("TPU")]
    return strategy, StrategyInfo("tpu", type(strategy).__name__, strategy.num_replicas_in_sync, devices)
