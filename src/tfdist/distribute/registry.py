"""The strategy registry: one record per ``tf.distribute`` strategy, as plain data.

Every fact the rest of tfdist needs about a strategy (its kind of
distribution, is it multi-process, synchronous, can it scale a float16 loss,
how is it backed up, which TensorFlow API makes it, which cluster jobs it
needs) is a field of its :class:`StrategySpec` here, or a property derived
from those fields; no other module names a strategy. A record is resolved
once, by :func:`get_spec`, and handed on.

Pure data: no TensorFlow, no config, no cluster. :mod:`tfdist.distribute.builders`
makes a record's strategy; :mod:`tfdist.train.checks` checks params and
clusters against it. So the compare stage can ask a record a question
without depending on how strategies are built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tfdist.errors import StrategyError

#: Kinds of distribution: none, replicas of the model (data), its layers split over devices (model),
#: and the same split fed micro-batches (pipeline).
PARADIGMS = ("none", "data", "model", "pipeline")
#: How a step moves data between devices, per paradigm and strategy (what ``train.step_costs`` counts).
COMMUNICATION = ("none", "reduce_to_one", "central", "ring", "push_pull", "activations")


def splits_layers(paradigm: str) -> bool:
    """Whether a kind of distribution places the model's layers on different devices (model and pipeline)."""
    return paradigm in ("model", "pipeline")


@dataclass(frozen=True)
class StrategySpec:
    """Everything tfdist knows about one strategy.

    Attributes:
        name: the lower-case name users write (``--strategy``, ``distributed.strategies``).
        paradigm: one of :data:`PARADIGMS`: ``none`` (no distribution), ``data``
            (replicas of the whole model on shards of each batch), ``model`` (the
            model's layers split over devices, each batch crossing them) or
            ``pipeline`` (the same split, each batch cut into micro-batches that
            keep every stage busy).
        tf_strategy: the ``tf.distribute`` API that makes it (``get_strategy``
            for the default strategy, which a layer split also runs under).
        multi_process: replicas live in several processes joined by a cluster
            spec (TF_CONFIG): cluster mode, or the local launcher.
        synchronous: all replicas apply each update together.
        loss_scaling: tf_keras's LossScaleOptimizer works under it (each replica
            holds its own variable copy), so mixed_float16 can train.
        backup: ``keras`` (tf_keras ``BackupAndRestore`` accepts it) or
            ``checkpoint`` (a ``tf.train.CheckpointManager`` plus ``initial_epoch``).
        cluster_jobs: jobs a cluster for it must have (one of each tuple);
            empty for single-process strategies.
        forbidden_jobs: jobs a cluster for it must not have.
        local_jobs: the jobs of the cluster the local launcher lays out, in
            order; :meth:`task_counts` says how many tasks each gets.
        coordinated: the chief runs every step on the other tasks, which only
            serve and never end on their own (parameter_server), rather than
            every task training (multi_worker_mirrored).
        in_pipeline: may be listed in ``distributed.strategies``.
        communication: what a step moves between devices (:data:`COMMUNICATION`):
            gradients reduced to one device and back, variables read from a central
            device, a ring all-reduce, a worker's pull and push to the parameter
            servers, or activations and their gradients across layer stages.
        loops: the ``train.loop`` values it trains with.
    """

    name: str
    paradigm: str
    tf_strategy: str
    multi_process: bool
    synchronous: bool
    loss_scaling: bool
    backup: str
    cluster_jobs: tuple[tuple[str, ...], ...] = ()
    forbidden_jobs: tuple[str, ...] = ()
    local_jobs: tuple[str, ...] = ()
    coordinated: bool = False
    in_pipeline: bool = True
    communication: str = "none"
    loops: tuple[str, ...] = ("fit", "custom")

    @property
    def distributes(self) -> bool:
        """Anything but normal, undistributed training (:data:`NORMAL_STRATEGY`)."""
        return self.name != NORMAL_STRATEGY

    @property
    def splits_layers(self) -> bool:
        """The model's layers are placed on different devices (model and pipeline parallelism)."""
        return splits_layers(self.paradigm)

    @property
    def pipelined(self) -> bool:
        """Each batch is cut into micro-batches that flow through the layer stages (GPipe)."""
        return self.paradigm == "pipeline"

    @property
    def all_reduces_between_processes(self) -> bool:
        """Each step all-reduces the gradients between worker processes: what gradient compression applies to."""
        return self.communication == "ring"

    @property
    def has_ps(self) -> bool:
        """Its cluster has parameter servers."""
        return "ps" in self.local_jobs

    def micro_batches(self, configured: int) -> int:
        """Pieces a step's batch is cut into: ``distributed.micro_batches`` when pipelined, else 1 (whole)."""
        return configured if self.pipelined else 1

    def task_counts(self, workers: int, ps: int) -> dict[str, int]:
        """Tasks per job of its cluster, in :attr:`local_jobs` order: one chief, ``workers`` workers, ``ps`` ps."""
        sizes = {"chief": 1, "worker": workers, "ps": ps}
        return {job: sizes[job] for job in self.local_jobs}


_SPECS = (
    StrategySpec("default", "none", "get_strategy", multi_process=False, synchronous=True, loss_scaling=True,
                 backup="keras", in_pipeline=False),
    StrategySpec("one_device", "none", "OneDeviceStrategy", multi_process=False, synchronous=True, loss_scaling=True,
                 backup="checkpoint"),
    StrategySpec("mirrored", "data", "MirroredStrategy", multi_process=False, synchronous=True, loss_scaling=True,
                 backup="keras", communication="reduce_to_one"),
    StrategySpec("central_storage", "data", "CentralStorageStrategy", multi_process=False, synchronous=True,
                 loss_scaling=False, backup="checkpoint", communication="central"),
    StrategySpec("multi_worker_mirrored", "data", "MultiWorkerMirroredStrategy", multi_process=True, synchronous=True,
                 loss_scaling=True, backup="keras", cluster_jobs=(("worker", "chief"),), forbidden_jobs=("ps",),
                 local_jobs=("worker",), communication="ring"),
    StrategySpec("parameter_server", "data", "ParameterServerStrategy", multi_process=True, synchronous=False,
                 loss_scaling=False, backup="keras", cluster_jobs=(("chief",), ("worker",), ("ps",)),
                 local_jobs=("chief", "worker", "ps"), coordinated=True, communication="push_pull"),
    StrategySpec("model_parallel", "model", "get_strategy", multi_process=False, synchronous=True, loss_scaling=True,
                 backup="keras", communication="activations"),
    StrategySpec("pipeline_parallel", "pipeline", "get_strategy", multi_process=False, synchronous=True,
                 loss_scaling=True, backup="keras", communication="activations", loops=("custom",)),
    StrategySpec("tpu", "data", "TPUStrategy", multi_process=False, synchronous=True, loss_scaling=False,
                 backup="keras", in_pipeline=False),
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


def check_pipeline(names: Sequence[str], key: str = "distributed.strategies") -> None:
    """Refuse a ``distributed.strategies`` entry that is not a strategy the pipeline can run, naming it.

    Raises:
        StrategyError: ``distributed.strategies[i] must be one of ...; got 'x'``.
    """
    for i, name in enumerate(names):
        if name not in PIPELINE_STRATEGIES:
            raise StrategyError(f"{key}[{i}] must be one of {', '.join(PIPELINE_STRATEGIES)}; got {name!r}")
