"""Train the seed model under a strategy with Keras ``fit``, timed per epoch.

The loop reports through Keras callbacks only: tracking (MLflow) plugs in as
one, and tests run without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from tfdist.config.knobs import Config, TrainConfig
from tfdist.data.input_pipeline import make_dataset, make_dataset_fn, make_ordered
from tfdist.data.prepared import DataSpec, PreparedSplit, scaled
from tfdist.distribute.builders import StrategyInfo
from tfdist.distribute.registry import StrategySpec
from tfdist.errors import InputError
from tfdist.files import disk
from tfdist.records.history import EPOCH_COLUMNS, OPTIONAL_COLUMNS
from tfdist.records.reports import CollectiveCosts, Findings
from tfdist.resume.backup import RunBackup, restored_history
from tfdist.resume.checkpoints import Moments, epochs_backed_up, resume_callbacks
from tfdist.resume.within_epoch import Preemption, StepBackup, StopWhenPreempted, preemption_for, within_epoch
from tfdist.tf_imports import keras, tf
from tfdist.tf_private import inputs_kept_alive, one_device_input_options, tracing_count
from tfdist.train import precision
from tfdist.train.callbacks import DivergenceGuard, EpochTimer, InputWait, LinearWarmup, StartupTimer, steady_state
from tfdist.train.checks import applied_compression
from tfdist.train.kernels import KernelCheck, kernel_check
from tfdist.train.models import build_model, compile_model, trained_weights
from tfdist.train.profiling import ProfileEpoch, profile_callback


@dataclass
class TrainResult:
    """A trained model and what it cost.

    Attributes:
        model: the trained Keras model (its variables belong to the strategy).
        history: one dict per epoch with :data:`EPOCH_COLUMNS` (and those of :data:`OPTIONAL_COLUMNS` the run
            has: the custom loop's gradient statistics, the input's share).
        global_batch_size: examples per step across all replicas.
        learning_rate: the effective learning rate, after scaling (and warm-up).
        warmup_steps: steps of linear warm-up before ``learning_rate`` is reached.
        steps_per_epoch: optimizer steps per epoch.
        traces: times each step function was traced (``train``, ``test``); a
            fixed batch shape keeps ``train`` at 1.
        train_seconds: wall time of ``fit`` (training and validation); for a
            resumed run, plus the training time of the restored epochs.
        samples_per_second: training examples per second of training time.
        resumed_at_epoch: epochs restored from a backup (0: trained from scratch).
        input_share: the share of the training time steps waited for their batch (epochs after the first;
            None where not timed: :class:`tfdist.train.callbacks.InputWait`).
        steady_epoch_seconds: median training time of the epochs after the first
            (the first also traces the step functions), or of the only epoch.
        first_epoch_overhead_seconds: how much longer the first epoch took than that.
        steady_samples_per_second: training examples per second at steady state.
        startup_seconds: from the process's start to the beginning of ``fit``
            (imports, strategy, data, tracking), or None where unknown.
        collectives: the all-reduce's cost between the workers, measured after
            training (synchronous multi-worker runs; None elsewhere).
        profiled_steps: steps this process captured in the profiler (``train.profile_steps``; 0: none).
        profiled_epoch: the epoch they were in (1-based; 0: none); the steady figures leave it out where
            other steady epochs remain: the capture slows it.
        kernel_checks: what each check of the train function's kernels found on each task (oneDNN's pass leaving
            one to Eigen's: :class:`tfdist.train.kernels.KernelCheck`): the first after its first call, one more after
            each retrace; empty where not checked (oneDNN off, ParameterServer).
    """

    model: keras.Model
    history: list[dict[str, float]]
    global_batch_size: int
    learning_rate: float
    warmup_steps: int
    steps_per_epoch: int
    traces: dict[str, int]
    train_seconds: float
    samples_per_second: float
    resumed_at_epoch: int = 0
    steady_epoch_seconds: float = 0.0
    input_share: float | None = None
    first_epoch_overhead_seconds: float = 0.0
    steady_samples_per_second: float = 0.0
    startup_seconds: float | None = None
    collectives: CollectiveCosts | None = None
    profiled_steps: int = 0
    profiled_epoch: int = 0
    kernel_checks: list[Findings] = field(default_factory=list)

    def final(self) -> dict[str, float]:
        """The last epoch's loss/accuracy and val_loss/val_accuracy."""
        last = self.history[-1]
        return {key: last[key] for key in ("loss", "accuracy", "val_loss", "val_accuracy")}

    def measured(self) -> dict[str, Any]:
        """What the fit measured, under the train report's field names (:class:`tfdist.records.reports.TrainReport`)."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("model", "history")}
        return {**own, "epochs": len(self.history), **self.final()}


def effective_learning_rate(config: TrainConfig, global_batch_size: int) -> float:
    """``learning_rate``, times global batch / per-replica batch under ``lr_scaling: linear``."""
    if config.lr_scaling == "linear":
        return config.learning_rate * global_batch_size / config.batch_size
    return config.learning_rate


def train_model(
    config: Config, spec: StrategySpec, strategy: tf.distribute.Strategy, info: StrategyInfo, *,
    data: DataSpec, train: PreparedSplit, val: PreparedSplit,
    callbacks: list[keras.callbacks.Callback] | tuple = (),
    backup: RunBackup | None = None, record_backup: bool = True,
    moments: Moments | None = None, profile_dir: Path | None = None,
) -> TrainResult:
    """Build, compile and ``fit`` the model of ``model.kind`` for ``data`` under ``strategy`` (``info``: what it is).

    ``train.batch_size`` is per replica, so the global batch grows with the
    replicas, as the keras-io distributed guide does. Under ParameterServer a step is one
    worker's batch (its replicas in sync, one on a CPU worker) and the workers take steps
    concurrently: an epoch is still one pass over the data, split into steps that whichever worker is free runs.

    With ``backup``, the run backs up every epoch (and within epochs: :class:`Backups`) and resumes from the
    last backup, reading the batches the uninterrupted run would; ``record_backup`` (the chief) also keeps the
    history there, and the returned history then covers every epoch. ``callbacks`` see an epoch once it is backed
    up; ``moments`` is told each moment of an epoch's backup (:func:`tfdist.resume.checkpoints.resume_callbacks`).
    With ``train.profile_steps``, this process's steady steps are captured into ``profile_dir``
    (:mod:`tfdist.train.profiling`).

    Raises:
        InputError: the training split is smaller than one global batch.
        Diverged: the loss became NaN or infinite.
    """
    plan = FitPlan.of(config, spec, info, len(train), len(val))
    keras.utils.set_random_seed(config.seed)
    model = build_compiled(config, data, strategy, plan)
    backups = Backups.of(config, spec, plan, model, backup, record_backup, moments)
    train_input, val_input = plan.inputs(train, val, config.seed, strategy,
                                         kept_alive=spec.multi_process or info.replicas > 1,
                                         done_epochs=backups.done_epochs, done_steps=backups.done_steps)
    timer, startup, waits = backups.timer, StartupTimer(), input_waits(model, info.replicas == 1 and not spec.multi_process)
    profile = profile_callback(config.train.profile_steps, profile_dir, backups.initial_epoch, config.train.epochs,
                               plan.steps, plan.asynchronous)
    kernels = None if plan.asynchronous else kernel_check(strategy, spec.multi_process, config.runtime.onednn_retraces)
    started = time.perf_counter()
    try:
        with backups.preemption.listening() if backups.preemption else contextlib.nullcontext():
            fit = model.fit(
                train_input,
                validation_data=val_input,
                validation_steps=plan.val_steps,
                epochs=config.train.epochs,
                initial_epoch=backups.initial_epoch,
                steps_per_epoch=plan.steps,  # the training input is endless (FitPlan.train_input)
                callbacks=[startup, timer, *filter(None, (waits, profile, kernels)), DivergenceGuard(),
                           *backups.callbacks, *callbacks],
                verbose=2,
            )
    except (tf.errors.OpError, OSError) as err:
        raise _fit_error(err, train, backup) from None
    seconds = time.perf_counter() - started
    history = _epochs(fit.history, fit.epoch)
    resumed_at = int(history[0]["epoch"]) - 1 if history else config.train.epochs
    restored = restored_history(backup, resumed_at + 1) if backup is not None and record_backup else []
    seconds += sum(row["epoch_seconds"] for row in restored)  # the restored epochs' training time
    return plan.result(model, restored + history, seconds, resumed_at if backup is not None else 0, startup.seconds,
                       profile, kernels)


def _fit_error(err: Exception, train: PreparedSplit, backup: RunBackup | None) -> Exception:
    """What to raise for ``err`` from ``fit``: damaged prepared data or a full disk in one line, else ``err``."""
    if isinstance(err, tf.errors.DataLossError):  # a prepared file's record failed its CRC as it was read
        what = re.sub(r"\{\{.*?\}\}\s*", "", err.message.splitlines()[0])  # TensorFlow's function names
        return InputError(f"the prepared data in {train.folder} is damaged (TensorFlow: {what}); rerun the "
                          "preprocess stage (dvc repro preprocess)")
    if backup is None or not disk.is_disk_full(err):  # the epoch's backup: TensorFlow's checkpoint writer, or state.json
        return err
    return disk.disk_full_in(backup.folder.parent.parent, "while backing up an epoch",
                             "training resumes from the last epoch backed up")


def input_share(history: list[dict[str, float]]) -> float | None:
    """The input's share of the training time over the epochs after the first (the first too, where alone)."""
    timed = [row for row in history if "input_share" in row]
    steady = timed[1:] or timed
    seconds = sum(row["epoch_seconds"] for row in steady)
    return sum(row["input_share"] * row["epoch_seconds"] for row in steady) / seconds if seconds else None


def input_waits(model: Any, timed: bool) -> InputWait | None:
    """The callback adding the input's share to each epoch's logs, its steps timed into a variable of this process
    (made outside the strategy's scope); ``timed`` only where one replica steps in this process (normal training):
    with several replicas, or a cluster's hand-over of each batch, a trace showed the arrival's timestamp run at the
    step's end, not at the arrival (docs/comparing.md)."""
    if not timed:
        return None
    waited = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="input_waited")
    model.time_input_waits(waited)
    return InputWait(waited)


@dataclass(frozen=True)
class Backups:
    """What a run resumes from and the callbacks that back it up (none without a backup folder).

    Attributes:
        callbacks: the epoch-end backup's and, in synchronous training, the one within epochs.
        initial_epoch: the epoch ``fit`` starts at (a step within it: the step backup's callback says).
        done_epochs, done_steps: what the backups hold (steps of the epoch after them), for the input.
        timer: the epoch timer, carrying a resumed epoch's seconds before the stop.
        preemption: SIGTERM as preemption while ``fit`` runs (a synchronous cluster's tasks agree on its step).
    """

    callbacks: list[Any]
    initial_epoch: int
    done_epochs: int
    done_steps: int
    timer: EpochTimer
    preemption: Preemption | None

    @classmethod
    def of(cls, config: Config, spec: StrategySpec, plan: FitPlan, model: Any, backup: RunBackup | None,
           record: bool, moments: Moments | None) -> Backups:
        samples = plan.steps * plan.global_batch
        if backup is None:
            return cls([], 0, 0, 0, EpochTimer(samples), None)
        callbacks, initial_epoch = resume_callbacks(backup, spec.backup, model, record, moments)
        done_epochs = epochs_backed_up(backup, spec.backup)
        if plan.asynchronous:  # a ParameterServer coordinator's steps are scheduled, not done: epoch ends only
            preemption = Preemption()
            callbacks.append(StopWhenPreempted(preemption, done_epochs))
            return cls(callbacks, initial_epoch, done_epochs, 0, EpochTimer(samples), preemption)
        within = within_epoch(backup, done_epochs, plan.steps)
        timer = EpochTimer(samples, within.seconds if within else 0.0)
        preemption = preemption_for(model.distribute_strategy, spec.multi_process)
        callbacks.append(StepBackup(model, backup, config.train.backup_every, record=record, clock=timer.elapsed,
                                    preemption=preemption, resume=within, moments=moments))
        return cls(callbacks, initial_epoch, done_epochs, within.step if within else 0, timer, preemption)


@dataclass(frozen=True)
class FitPlan:
    """Batch sizes, steps and learning rate of one ``fit``, decided before the model is built.

    Attributes:
        global_batch: examples per step across the replicas in sync.
        steps: optimizer steps per epoch.
        learning_rate: after ``train.lr_scaling``.
        warmup_steps: steps of linear warm-up (0: none).
        asynchronous: ParameterServer training (per-worker datasets, a step count per epoch).
        val_batch: the validation batch size.
        val_steps: validation batches per epoch, read from an endless input (None: a finite input, read to its end).
        shards: validation shards for ParameterServer's exact evaluation (0: not sharded).
        stage_devices: the devices the model's layers are split over (model and
            pipeline parallelism; empty: the strategy places the model).
        micro_batches: pieces each step's batch is cut into (1: whole).
        pipelined: the model runs GPipe's step over the micro-batches (pipeline parallelism).
        workers: worker processes stepping together; more than one read a shard each.
        compression: the dtype its gradients cross the wire in (:func:`tfdist.train.checks.applied_compression`).
        input_pipelines: worker processes reading training input, each its own files (synchronous or not).
    """

    global_batch: int
    steps: int
    learning_rate: float
    warmup_steps: int
    asynchronous: bool
    val_batch: int
    val_steps: int | None
    shards: int
    stage_devices: tuple[str, ...] = ()
    micro_batches: int = 1
    pipelined: bool = False
    workers: int = 1
    compression: str = "none"
    input_pipelines: int = 1

    @classmethod
    def of(cls, config: Config, spec: StrategySpec, info: StrategyInfo, train_size: int, val_size: int) -> FitPlan:
        global_batch = config.train.batch_size * info.replicas
        steps = train_size // global_batch
        if steps == 0:
            raise InputError(
                f"train.batch_size {config.train.batch_size} x {info.replicas} replicas = {global_batch} "
                f"exceeds the {train_size} training images; lower train.batch_size"
            )
        profile = config.train.profile_steps
        if profile and (profile > steps or config.train.epochs < 2):
            raise InputError(f"train.profile_steps {profile} asks for more than an epoch's steady steps "
                             f"({steps} steps an epoch, from the second of {config.train.epochs}); set it to at most "
                             f"{steps}, with train.epochs 2 or more, or 0 for none")
        asynchronous = not info.synchronous
        val_batch, val_steps, shards = global_batch, -(-val_size // global_batch) or None, 0
        if asynchronous and val_size:
            # Exact validation under ParameterServer: the workers evaluate whole shards of the
            # validation batches, so there must be at least one batch per shard; the batch size
            # does not change the metrics. One shard per worker: tf_keras's "auto", 5 per worker,
            # costs a remote closure each, more than doubling validation (docs/performance.md).
            shards = min(info.workers, val_size)
            val_batch, val_steps = min(global_batch, val_size // shards), None
        return cls(global_batch, steps, effective_learning_rate(config.train, global_batch),
                   round(config.train.warmup_epochs * steps), asynchronous, val_batch, val_steps, shards,
                   stage_devices=tuple(info.devices) if spec.splits_layers else (),
                   micro_batches=spec.micro_batches(config.distributed.micro_batches), pipelined=spec.pipelined,
                   workers=info.workers if info.synchronous else 1, compression=applied_compression(spec, config),
                   input_pipelines=info.workers if spec.multi_process else 1)

    def schedule(self) -> float | LinearWarmup:
        return LinearWarmup(self.learning_rate, self.warmup_steps) if self.warmup_steps else self.learning_rate

    def inputs(self, train: PreparedSplit, val: PreparedSplit, seed: int, strategy: tf.distribute.Strategy, *,
               kept_alive: bool, done_epochs: int = 0, done_steps: int = 0) -> tuple[Any, Any]:
        """The training and validation inputs; ``kept_alive`` where destroying their iterators would stall the stage.

        ``done_epochs`` (and ``done_steps`` of the next): what a resumed run
        restored; its input starts at the batches the uninterrupted run would read next.
        """
        train_input = self.train_input(train, seed, strategy, done_epochs, done_steps)
        val_input = self.val_input(val)
        if kept_alive:
            train_input = inputs_kept_alive(strategy, train_input, coordinated=self.asynchronous)
            if self.val_steps:  # an endless validation input (val_input)
                val_input = inputs_kept_alive(strategy, val_input, coordinated=False)
        return train_input, val_input

    def train_input(self, train: PreparedSplit, seed: int, strategy: tf.distribute.Strategy, start_epoch: int = 0,
                    start_step: int = 0) -> Any:
        """An endless dataset, ``steps`` batches an epoch: on several synchronous workers each reading its own
        files (distributed by ``strategy``), under ParameterServer a per-worker dataset creator.

        Endless, because a finite input costs every epoch a new iterator: over
        several replicas a multi-device one, whose per-device functions TensorFlow
        traces anew (docs/performance.md, "Start-up");
        across synchronous workers a collective every step besides, as each
        worker must learn whether every other still has a batch (tf.distribute's
        ``get_next_as_optional``). Cut into epochs by the step count, an endless
        input is iterated once and has no end to agree on. Each epoch's order is
        its own, seeded by its number (:mod:`tfdist.data.input_pipeline`), so
        a resumed run starts at ``start_epoch`` and reads what the uninterrupted
        run would have (from batch ``start_step`` of it); under ParameterServer,
        whose interleaving of workers is not reproducible anyway, each worker
        reads its files pass after pass.
        """
        if self.asynchronous:
            return keras.utils.experimental.DatasetCreator(
                make_dataset_fn(train, self.global_batch, seed=seed, steps=None, pipelines=self.input_pipelines,
                                by_worker_index=True, start_epoch=start_epoch),
                input_options=one_device_input_options(strategy))
        if self.workers > 1:  # each worker reads only its files
            return strategy.distribute_datasets_from_function(
                make_dataset_fn(train, self.global_batch, seed=seed, steps=self.steps, pipelines=self.workers,
                                start_epoch=start_epoch, start_step=start_step), one_device_input_options(strategy))
        return make_dataset(train, self.global_batch, seed=seed, start_epoch=start_epoch, start_step=start_step,
                            steps=self.steps)

    def val_input(self, val: PreparedSplit) -> Any:
        """The validation batches: one pass of them every ``val_steps``, repeated without end; None without images.

        Endless for the same reason as the training input: a finite one costs
        every epoch's validation a new iterator, over several replicas a
        multi-device one whose per-device functions are traced anew (most of
        mirrored's validation, docs/performance.md). Batched before it repeats, the
        last batch keeps its remainder, so each validation reads every image
        once, in order, as a finite pass does. Under ParameterServer the
        validation is exact, in shards the workers read to their ends: finite.
        """
        if not len(val):
            return None
        return make_ordered(val, self.val_batch, endless=self.val_steps is not None)

    def result(self, model: keras.Model, history: list[dict[str, float]], seconds: float, resumed_at: int,
               startup_seconds: float | None, profile: ProfileEpoch | None = None, kernels: KernelCheck | None = None
               ) -> TrainResult:
        """What the fit gave and cost, with throughput from the epochs' training time (the steady figures without
        the profiled epoch, where others remain)."""
        profiled = profile.epoch + 1 if profile and profile.captured else 0
        unprofiled = [row for row in history if row["epoch"] != profiled]
        steady, first_overhead = steady_state(unprofiled if len(unprofiled) > 1 else history)
        samples = self.steps * self.global_batch
        return TrainResult(
            model=model, history=history, global_batch_size=self.global_batch, learning_rate=self.learning_rate,
            warmup_steps=self.warmup_steps, steps_per_epoch=self.steps,
            traces={"train": tracing_count(getattr(model, "train_function", None)),
                    "test": tracing_count(getattr(model, "test_function", None))},
            train_seconds=seconds,
            samples_per_second=samples * len(history) / (sum(row["epoch_seconds"] for row in history) or float("inf")),
            resumed_at_epoch=resumed_at, steady_epoch_seconds=steady, first_epoch_overhead_seconds=first_overhead,
            steady_samples_per_second=samples / steady if steady else 0.0, startup_seconds=startup_seconds,
            input_share=input_share(history), profiled_steps=profile.captured if profile else 0, profiled_epoch=profiled,
            kernel_checks=kernels.checks if kernels else [],
        )


def build_compiled(config: Config, data: DataSpec, strategy: tf.distribute.Strategy, plan: FitPlan) -> keras.Model:
    """The model for ``data`` and ``train.loop``, built and compiled under the precision policy and ``strategy.scope()``."""
    with precision.policy(config.train.precision), strategy.scope():
        model = build_model(config.model, data, config.train.loop, list(plan.stage_devices) or None,
                            plan.micro_batches, plan.pipelined)
        compile_model(model, config.train, plan.schedule(), plan.compression,
                      **({"pss_evaluation_shards": plan.shards} if plan.shards else {}))
    return model


#: Steps of one replica a call of :func:`step_alone` runs: enough to amortise the call, few enough at batch 256.
STEPS_ALONE = 10


def step_alone(config: Config, data: DataSpec, train: PreparedSplit) -> Callable[[], Any]:
    """A call running :data:`STEPS_ALONE` steps of one replica with no strategy: a fresh model of ``config``,
    compiled as ``fit`` compiles it, on one per-replica batch of ``train`` held in memory.

    What a synchronous worker's step costs without its all-reduce and its distributed input, in the same
    process and on the same threads: the compute part of the step (:func:`tfdist.train.collectives.calibrate`).
    """
    batch = train.read(config.train.batch_size)
    with precision.policy(config.train.precision):
        model = build_model(config.model, data, config.train.loop)
        compile_model(model, replace(config.train, steps_per_execution=STEPS_ALONE), config.train.learning_rate)
    iterator = iter(tf.data.Dataset.from_tensors((scaled(batch.x), batch.y)).repeat())
    function = model.make_train_function()
    return lambda: function(iterator)


def _epochs(history: dict[str, list[float]], epochs: list[int]) -> list[dict[str, float]]:
    rows = []
    for i, epoch in enumerate(epochs):
        row: dict[str, float] = {"epoch": epoch + 1}
        row.update({key: float(history[key][i]) for key in EPOCH_COLUMNS[1:] + OPTIONAL_COLUMNS if key in history})
        rows.append(row)
    return rows


def weights_digest(model: keras.Model) -> str:
    """SHA-256 of the model's weights: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for array in trained_weights(model):
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()
