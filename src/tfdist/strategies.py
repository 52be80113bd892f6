"""The strategy registry: one record per ``tf.distribute`` strategy, and its builder.

Every fact the rest of tfdist needs about a strategy (is it multi-process,
synchronous, can it scale a float16 loss, how is it backed up, which devices
does it take, which cluster jobs does it need) is a field of its
:class:`StrategySpec` here; no other module names a strategy. Adding a strategy
is one record and its builder.

TensorFlow is imported lazily, on the first build: :mod:`tfdist.config`
validates ``distributed.strategies`` against this registry, and a stage must
report a bad param in well under a second, before TensorFlow's seconds-long import.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tfdist.cluster_spec import ClusterTask
from tfdist.errors import InputError

if TYPE_CHECKING:
    import tensorflow as tf

    from tfdist.config import Config

log = logging.getLogger(__name__)


class StrategyError(InputError):
    """An unknown strategy name, or one this machine cannot run (exit 2)."""


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


Builder = Callable[["StrategySpec", int, "ClusterTask | None", str],
                   "tuple[tf.distribute.Strategy, StrategyInfo]"]
#: multi_worker_mirrored's all-reduce implementations (``distributed.all_reduce``).
ALL_REDUCE = ("auto", "ring", "nccl")
#: How a step moves data between devices, per paradigm and strategy (what ``parallelism.bytes_per_step`` counts).
COMMUNICATION = ("none", "reduce_to_one", "central", "ring", "push_pull", "activations")


@dataclass(frozen=True)
class StrategySpec:
    """Everything tfdist knows about one strategy.

    Attributes:
        name: the lower-case name users write (``--strategy``, ``distributed.strategies``).
        paradigm: ``none`` (no distribution), ``data`` (replicas of the whole
            model on shards of each batch), ``model`` (the model's layers split
            over devices, each batch crossing them) or ``pipeline`` (the same
            split, each batch cut into micro-batches that keep every stage busy).
        multi_process: replicas live in several processes joined by a cluster
            spec (TF_CONFIG): cluster mode, or the local launcher.
        synchronous: all replicas apply each update together.
        loss_scaling: tf_keras's LossScaleOptimizer works under it (each replica
            holds its own variable copy), so mixed_float16 can train.
        backup: ``keras`` (tf_keras ``BackupAndRestore`` accepts it) or
            ``checkpoint`` (a ``tf.train.CheckpointManager`` plus ``initial_epoch``).
        device_rule: ``first`` (GPU 0, else the CPU), ``split`` (every GPU, else
            ``distributed.devices`` logical CPUs), ``per_task`` (each process's
            own devices) or ``tpu``.
        replica_count: how ``replicas`` is counted, in words for the reports.
        cluster_jobs: jobs a cluster for it must have (one of each tuple);
            empty for single-process strategies.
        forbidden_jobs: jobs a cluster for it must not have.
        local_jobs: how the local launcher lays out its cluster: job -> which
            ``distributed`` count sizes it (``one`` for a single task).
        launcher_trains: under the local launcher this process coordinates
            training (parameter_server's chief) rather than only waiting for
            worker processes that train (multi_worker_mirrored).
        in_pipeline: may be listed in ``distributed.strategies``.
        builder: makes the strategy (called with this spec, the device count,
            this process's cluster task, if any, and ``distributed.all_reduce``).
        communication: what a step moves between devices (:data:`COMMUNICATION`):
            gradients reduced to one device and back, variables read from a central
            device, a ring all-reduce, a worker's pull and push to the parameter
            servers, or activations and their gradients across layer stages.
        loops: the ``train.loop`` values it trains with.
    """

    name: str
    paradigm: str
    multi_process: bool
    synchronous: bool
    loss_scaling: bool
    backup: str
    device_rule: str
    replica_count: str
    builder: Builder
    cluster_jobs: tuple[tuple[str, ...], ...] = ()
    forbidden_jobs: tuple[str, ...] = ()
    local_jobs: Mapping[str, str] = field(default_factory=dict)
    launcher_trains: bool = False
    in_pipeline: bool = True
    communication: str = "none"
    loops: tuple[str, ...] = ("fit", "custom")

    @property
    def splits_layers(self) -> bool:
        """The model's layers are placed on different devices (model and pipeline parallelism)."""
        return self.paradigm in ("model", "pipeline")

    def check(self, config: Config) -> None:
        """Refuse at start, in one line, a combination of params this strategy cannot train.

        Raises:
            StrategyError: see :meth:`check_precision`; a ps job under Ray; a loop it does not train
                with; for a layer split, more devices than layers, XLA, or
                micro-batches that do not divide the batch.
        """
        self.check_precision(config.train.precision)
        if config.distributed.launcher == "ray" and self.multi_process and "ps" in self.local_jobs:
            raise StrategyError(
                f"strategy {self.name} cannot run under distributed.launcher ray: Ray Train's TensorflowTrainer "
                "writes a TF_CONFIG of workers only (no chief, no ps); use distributed.launcher local, or start "
                "its tasks with TF_CONFIG set (docs/cluster.md)"
            )
        if config.train.loop not in self.loops:
            raise StrategyError(
                f"strategy {self.name} needs train.loop {' or '.join(self.loops)}, not {config.train.loop}: its "
                "GPipe step (micro-batches, accumulated gradients) replaces Keras's built-in train step; "
                f"set train.loop: {self.loops[0]}"
            )
        if not self.splits_layers:
            return
        layers = len(config.model.hidden_units) + 1
        if config.distributed.devices > layers:
            raise StrategyError(
                f"distributed.devices {config.distributed.devices} > the {layers} layers of the model "
                f"(model.hidden_units {config.model.hidden_units} and the output): {self.name} puts whole layers "
                "on devices; add hidden layers or lower distributed.devices"
            )
        if config.train.jit_compile:
            raise StrategyError(
                f"train.jit_compile true: XLA compiles a step for one device, which would undo {self.name}'s "
                "placement; set train.jit_compile: false"
            )
        if self.paradigm == "pipeline" and config.train.batch_size % config.distributed.micro_batches:
            raise StrategyError(
                f"distributed.micro_batches {config.distributed.micro_batches} does not divide train.batch_size "
                f"{config.train.batch_size}: GPipe cuts each batch into equal micro-batches; pick a divisor"
            )

    def check_precision(self, precision: str) -> None:
        """Refuse at start a precision TensorFlow cannot train under this strategy.

        Raises:
            StrategyError: mixed_float16 (which needs loss scaling) under a strategy
                whose variables are not copied per replica (tf_keras's
                LossScaleOptimizer refuses CentralStorage and ParameterServer).
        """
        if precision == "mixed_float16" and not self.loss_scaling:
            able = [name for name, spec in REGISTRY.items() if spec.loss_scaling]
            raise StrategyError(
                f"train.precision mixed_float16 needs loss scaling, which TensorFlow supports only under "
                f"{', '.join(able)}, not {self.name}; use mixed_bfloat16 (no loss scaling) or float32"
            )

    def build(self, devices: int = 2, task: ClusterTask | None = None,
              all_reduce: str = "auto") -> tuple[tf.distribute.Strategy, StrategyInfo]:
        """The TensorFlow strategy, made first thing in the process (logical devices freeze after the first op)."""
        return self.builder(self, devices, task, all_reduce)


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


def _first_device() -> str:
    return "/gpu:0" if _tensorflow().config.list_physical_devices("GPU") else "/cpu:0"


def _resolver(task: ClusterTask) -> Any:
    """TensorFlow's cluster resolver for this process's task."""
    tf = _tensorflow()
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(dict(task.cluster)), task_type=task.task_type, task_id=task.task_index, rpc_layer="grpc",
    )


def _info(spec: StrategySpec, strategy: Any, devices: list[str], workers: int = 1, ps: int = 0) -> StrategyInfo:
    info = StrategyInfo(spec.name, type(strategy).__name__, strategy.num_replicas_in_sync, devices, workers, ps,
                        spec.synchronous)
    log.info("strategy %s: %d replica(s) on %s", spec.name, info.replicas, ", ".join(info.devices))
    return info


def _build_default(spec: StrategySpec, devices: int, task: ClusterTask | None, all_reduce: str) -> tuple[Any, StrategyInfo]:
    strategy = _tensorflow().distribute.get_strategy()
    return strategy, _info(spec, strategy, [_first_device()])


def _build_one_device(spec: StrategySpec, devices: int, task: ClusterTask | None, all_reduce: str) -> tuple[Any, StrategyInfo]:
    device = _first_device()
    strategy = _tensorflow().distribute.OneDeviceStrategy(device)
    return strategy, _info(spec, strategy, [device])


def _build_mirrored(spec: StrategySpec, devices: int, task: ClusterTask | None, all_reduce: str) -> tuple[Any, StrategyInfo]:
    tf = _tensorflow()
    names = configure_cpu_devices(devices)
    # NCCL all-reduce exists only between GPUs; on CPUs reduce through one device.
    on_cpus = all("cpu" in d for d in names)
    cross_device_ops = tf.distribute.ReductionToOneDevice(reduce_to_device="/cpu:0") if on_cpus else None
    strategy = tf.distribute.MirroredStrategy(names, cross_device_ops=cross_device_ops)
    return strategy, _info(spec, strategy, names)


def _build_central_storage(spec: StrategySpec, devices: int, task: ClusterTask | None,
                           all_reduce: str) -> tuple[Any, StrategyInfo]:
    names = configure_cpu_devices(devices)
    strategy = _tensorflow().distribute.experimental.CentralStorageStrategy(names, parameter_device="/cpu:0")
    return strategy, _info(spec, strategy, names)


def _build_multi_worker_mirrored(spec: StrategySpec, devices: int, task: ClusterTask | None,
                                 all_reduce: str) -> tuple[Any, StrategyInfo]:
    # Every worker process contributes its local device(s): one CPU, or its GPUs.
    # AUTO picks ring collectives on CPUs and NCCL between GPUs; NCCL needs GPUs on every worker.
    tf = _tensorflow()
    if all_reduce == "nccl" and not tf.config.list_physical_devices("GPU"):
        raise StrategyError("distributed.all_reduce nccl needs a GPU on every worker (NCCL runs between GPUs), "
                            "and this machine has none; use auto or ring")
    implementation = tf.distribute.experimental.CommunicationImplementation
    options = tf.distribute.experimental.CommunicationOptions(implementation=getattr(implementation, all_reduce.upper()))
    kwargs = {"cluster_resolver": _resolver(task)} if task is not None else {}
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options, **kwargs)
    tasks = [f"/job:{job}/task:{i}" for job in ("chief", "worker") for i in range(task.count(job) if task else 0)]
    tasks = tasks or ["/job:localhost/task:0"]
    return strategy, _info(spec, strategy, tasks, workers=len(tasks))


def _build_parameter_server(spec: StrategySpec, devices: int, task: ClusterTask | None,
                            all_reduce: str) -> tuple[Any, StrategyInfo]:
    # Each worker runs whole steps on its own and pushes its updates to the
    # parameter servers without waiting for the others: asynchronous training.
    # num_replicas_in_sync is the replicas *per worker* (1 on a CPU worker), so a
    # step's global batch is batch_size x that, whatever the number of workers.
    if task is None:
        raise StrategyError(
            f"strategy '{spec.name}' needs a cluster with chief, worker and ps tasks; "
            "set TF_CONFIG or let the train stage launch one locally"
        )
    strategy = _tensorflow().distribute.ParameterServerStrategy(_resolver(task))
    workers = [f"/job:worker/task:{i}" for i in range(task.count("worker"))]
    return strategy, _info(spec, strategy, workers, workers=len(workers), ps=task.count("ps"))


def _build_layer_split(spec: StrategySpec, devices: int, task: ClusterTask | None,
                      all_reduce: str) -> tuple[Any, StrategyInfo]:
    # No tf.distribute strategy splits a model: the default strategy holds it, and the
    # model places its layers on these devices itself (tfdist.placement).
    names = configure_cpu_devices(devices)
    strategy = _tensorflow().distribute.get_strategy()
    info = StrategyInfo(spec.name, f"{type(strategy).__name__} + layers on devices", 1, names, 1, 0, spec.synchronous)
    log.info("strategy %s: the model's layers on %s", spec.name, ", ".join(names))
    return strategy, info


def _build_tpu(spec: StrategySpec, devices: int, task: ClusterTask | None, all_reduce: str) -> tuple[Any, StrategyInfo]:
    tf = _tensorflow()
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as err:
        raise StrategyError(
            f"strategy '{spec.name}' needs a TPU, and none was found ({str(err).splitlines()[0]}); "
            "run on a TPU VM or choose mirrored"
        ) from None
    strategy = tf.distribute.TPUStrategy(resolver)
    return strategy, _info(spec, strategy, [d.name for d in tf.config.list_logical_devices("TPU")])


_SPECS = (
    StrategySpec("default", "none", multi_process=False, synchronous=True, loss_scaling=True, backup="keras",
                 device_rule="first", replica_count="1", builder=_build_default, in_pipeline=False),
    StrategySpec("one_device", "none", multi_process=False, synchronous=True, loss_scaling=True, backup="checkpoint",
                 device_rule="first", replica_count="1", builder=_build_one_device),
    StrategySpec("mirrored", "data", multi_process=False, synchronous=True, loss_scaling=True, backup="keras",
                 device_rule="split", replica_count="one per device", builder=_build_mirrored,
                 communication="reduce_to_one"),
    StrategySpec("central_storage", "data", multi_process=False, synchronous=True, loss_scaling=False,
                 backup="checkpoint", device_rule="split", replica_count="one per device",
                 builder=_build_central_storage, communication="central"),
    StrategySpec("multi_worker_mirrored", "data", multi_process=True, synchronous=True, loss_scaling=True,
                 backup="keras", device_rule="per_task", replica_count="one per device of every worker",
                 builder=_build_multi_worker_mirrored, cluster_jobs=(("worker", "chief"),), forbidden_jobs=("ps",),
                 local_jobs={"worker": "workers"}, communication="ring"),
    StrategySpec("parameter_server", "data", multi_process=True, synchronous=False, loss_scaling=False,
                 backup="keras", device_rule="per_task", replica_count="one per device of one worker (per step)",
                 builder=_build_parameter_server, cluster_jobs=(("chief",), ("worker",), ("ps",)),
                 local_jobs={"chief": "one", "worker": "workers", "ps": "ps"}, launcher_trains=True,
                 communication="push_pull"),
    StrategySpec("model_parallel", "model", multi_process=False, synchronous=True, loss_scaling=True, backup="keras",
                 device_rule="split", replica_count="1 (its layers on the devices)", builder=_build_layer_split,
                 communication="activations"),
    StrategySpec("pipeline_parallel", "pipeline", multi_process=False, synchronous=True, loss_scaling=True,
                 backup="keras", device_rule="split", replica_count="1 (layer stages, micro-batches in flight)",
                 builder=_build_layer_split, communication="activations", loops=("custom",)),
    StrategySpec("tpu", "data", multi_process=False, synchronous=True, loss_scaling=False, backup="keras",
                 device_rule="tpu", replica_count="one per TPU core", builder=_build_tpu, in_pipeline=False),
)
#: Every strategy by name, in the order users read them.
REGISTRY: dict[str, StrategySpec] = {spec.name: spec for spec in _SPECS}
#: The name of undistributed training (``train-normal``).
NORMAL_STRATEGY = "default"
#: Names ``--strategy`` accepts.
STRATEGY_NAMES = tuple(REGISTRY)
#: Names ``distributed.strategies`` accepts (one train-distributed stage each).
PIPELINE_STRATEGIES = tuple(name for name, spec in REGISTRY.items() if spec.in_pipeline)
#: What the default pipeline compares with normal training: every data-parallel strategy it can run.
DEFAULT_PIPELINE = tuple(name for name in PIPELINE_STRATEGIES if REGISTRY[name].paradigm == "data")


def get_spec(name: Any) -> StrategySpec:
    """The record of strategy ``name`` (case-insensitive).

    Raises:
        StrategyError: naming the value and the choices (YAML may turn ``off`` into
            ``False``: non-strings are refused too).
    """
    if not isinstance(name, str) or name.lower() not in REGISTRY:
        raise StrategyError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGY_NAMES)}")
    return REGISTRY[name.lower()]


def make_strategy(name: Any, devices: int = 2, task: ClusterTask | None = None,
                  all_reduce: str = "auto") -> tuple[tf.distribute.Strategy, StrategyInfo]:
    """Build the strategy called ``name``.

    Args:
        name: one of :data:`STRATEGY_NAMES`.
        devices: logical CPU devices for the ``split`` strategies when no GPU exists.
        task: this process's task in a cluster, for the multi-process strategies;
            MultiWorkerMirrored without one runs as a single worker, ParameterServer needs one.

    Raises:
        StrategyError: ``name`` is not a known strategy, or needs hardware or a
            cluster that is absent.
    """
    return get_spec(name).build(devices, task, all_reduce)
