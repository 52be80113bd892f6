"""Train the seed model under a strategy with Keras ``fit``, timed per epoch.

The loop reports through Keras callbacks only: tracking (MLflow) plugs in as
one, and tests run without it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfdist import precision
from tfdist.config import Config, TrainConfig
from tfdist.data import Digits, make_dataset, make_worker_dataset_fn
from tfdist.errors import InputError, RunError
from tfdist.models import build_model, compile_model, trained_weights
from tfdist.resume import RunBackup, restored_history
from tfdist.runtime import keras, tf
from tfdist.strategies import StrategyInfo

#: Resume messages keep the name of the feature users look for in the log.
resume_log = logging.getLogger("tfdist.resume")

EPOCH_COLUMNS = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "epoch_seconds", "samples_per_second")
#: Per-epoch columns only the custom loop's train step produces.
CUSTOM_LOOP_COLUMNS = ("gradient_norm", "gradient_norm_max", "nonfinite_steps")


def history_columns(history: list[dict[str, float]]) -> tuple[str, ...]:
    """The columns of ``history`` rows, in a stable order."""
    present = set(history[0]) if history else set()
    return EPOCH_COLUMNS + tuple(column for column in CUSTOM_LOOP_COLUMNS if column in present)


@dataclass
class TrainResult:
    """A trained model and what it cost.

    Attributes:
        model: the trained Keras model (its variables belong to the strategy).
        history: one dict per epoch with :data:`EPOCH_COLUMNS` (and, for the
            custom loop, :data:`CUSTOM_LOOP_COLUMNS`).
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
        steady_epoch_seconds: median training time of the epochs after the first
            (the first also traces the step functions), or of the only epoch.
        first_epoch_overhead: how much longer the first epoch took than that.
        steady_samples_per_second: training examples per second at steady state.
        startup_seconds: from the process's start to the beginning of ``fit``
            (imports, strategy, data, tracking), or None where unknown.
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
    first_epoch_overhead: float = 0.0
    steady_samples_per_second: float = 0.0
    startup_seconds: float | None = None

    def final(self) -> dict[str, float]:
        """The last epoch's loss/accuracy and val_loss/val_accuracy."""
        last = self.history[-1]
        return {key: last[key] for key in ("loss", "accuracy", "val_loss", "val_accuracy")}


class EpochTimer(keras.callbacks.Callback):
    """Adds ``epoch_seconds`` and ``samples_per_second`` (training part only) to epoch logs.

    It must run before callbacks that log the epoch, so they see both values.
    Validation time is left out: it would penalise runs with larger val splits.
    """

    def __init__(self, samples_per_epoch: int):
        super().__init__()
        self.samples_per_epoch = samples_per_epoch
        self._start = self._train_end = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start = time.perf_counter()
        self._train_end = 0.0

    def on_test_begin(self, logs: dict | None = None) -> None:
        if not self._train_end:
            self._train_end = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        seconds = (self._train_end or time.perf_counter()) - self._start
        if logs is not None:
            logs["epoch_seconds"] = seconds
            logs["samples_per_second"] = self.samples_per_epoch / seconds


class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """Ramps the learning rate linearly to ``target`` over ``warmup_steps``, then holds it.

    A schedule rather than a callback: the optimizer evaluates it in-graph at
    every step, which works under every strategy (ParameterServer refuses
    batch-level callbacks) and costs no Python per step.
    """

    def __init__(self, target: float, warmup_steps: int):
        super().__init__()
        self.target = target
        self.warmup_steps = warmup_steps

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        done = (tf.cast(step, tf.float32) + 1.0) / float(self.warmup_steps)
        return self.target * tf.minimum(1.0, done)

    def get_config(self) -> dict:
        return {"target": self.target, "warmup_steps": self.warmup_steps}


def effective_learning_rate(config: TrainConfig, global_batch_size: int) -> float:
    """``learning_rate``, times global batch / per-replica batch under ``lr_scaling: linear``."""
    if config.lr_scaling == "linear":
        return config.learning_rate * global_batch_size / config.batch_size
    return config.learning_rate


class Diverged(RunError):
    """The loss became NaN or infinite; ``epoch`` (1-based) and ``step`` say when."""

    def __init__(self, loss: float, epoch: int, step: int):
        super().__init__(
            f"training diverged: loss is {loss} at epoch {epoch} (step {step}); "
            "lower train.learning_rate or clip gradients (train.clip.method: global_norm)"
        )
        self.epoch, self.step = epoch, step


def process_age() -> float | None:
    """Seconds since this process started (Linux /proc), or None elsewhere."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return time.time() - (boot + ticks / os.sysconf("SC_CLK_TCK"))


class StartupTimer(keras.callbacks.Callback):
    """Records how long the process took to reach ``fit``: the stage's start-up cost."""

    seconds: float | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.seconds = process_age()


def steady_state(history: list[dict[str, float]]) -> tuple[float, float]:
    """``(steady epoch seconds, first-epoch overhead)`` from per-epoch training times."""
    seconds = [row["epoch_seconds"] for row in history]
    steady = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
    return steady, max(0.0, seconds[0] - steady)


class DivergenceGuard(keras.callbacks.Callback):
    """Stops at the first epoch whose loss is NaN or infinite, instead of training on.

    Per epoch, not per batch: batch hooks cost Python on every step and
    ParameterServer refuses them. It runs before the backup callbacks, so a
    diverged epoch is never backed up.
    """

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(loss):
            raise Diverged(loss, epoch + 1, int(self.model.optimizer.iterations.numpy()))


def train_model(
    config: Config,
    strategy: tf.distribute.Strategy,
    info: StrategyInfo,
    train: Digits,
    val: Digits,
    callbacks: list[keras.callbacks.Callback] | tuple = (),
    backup: RunBackup | None = None,
    record_backup: bool = True,
) -> TrainResult:
    """Build, compile and ``fit`` the seed model under ``strategy``.

    ``train.batch_size`` is per replica, so the global batch grows with the
    replicas, as the keras-io distributed guide does. Under ParameterServer a
    step is one worker's batch (its replicas in sync, one on a CPU worker) and
    the workers take steps concurrently: an epoch is still one pass over the
    data, split into steps that whichever worker is free runs.

    With ``backup``, the run backs up every epoch and resumes from that
    backup if it holds finished epochs; ``record_backup`` (the chief) also
    keeps the history there, and the returned history then covers every
    epoch, restored ones included.

    Raises:
        InputError: the training split is smaller than one global batch.
        Diverged: the loss became NaN or infinite.
    """
    global_batch = config.train.batch_size * info.replicas
    steps = len(train) // global_batch
    if steps == 0:
        raise InputError(
            f"train.batch_size {config.train.batch_size} x {info.replicas} replicas = {global_batch} "
            f"exceeds the {len(train)} training digits; lower train.batch_size"
        )
    keras.utils.set_random_seed(config.seed)
    learning_rate = effective_learning_rate(config.train, global_batch)
    warmup_steps = round(config.train.warmup_epochs * steps)
    schedule = LinearWarmup(learning_rate, warmup_steps) if warmup_steps else learning_rate
    asynchronous = not info.synchronous
    val_batch, shards = global_batch, 0
    if asynchronous and len(val):
        # Exact validation under ParameterServer: the workers evaluate whole shards of
        # the validation batches (tf_keras's "auto" is 5 per worker), so there must be
        # at least one batch per shard; the batch size does not change the metrics.
        shards = min(5 * info.workers, len(val))
        val_batch = min(global_batch, len(val) // shards)
    with precision.policy(config.train.precision), strategy.scope():
        model = build_model(config.model, config.train.loop)
        compile_model(model, config.train, schedule, **({"pss_evaluation_shards": shards} if shards else {}))
    if asynchronous:
        train_input = keras.utils.experimental.DatasetCreator(make_worker_dataset_fn(train, global_batch, config.seed))
    else:
        train_input = make_dataset(train, global_batch, shuffle=True, seed=config.seed)
    val_ds = make_dataset(val, val_batch, shuffle=False, seed=config.seed) if len(val) else None
    timer, startup = EpochTimer(steps * global_batch), StartupTimer()
    resume, initial_epoch = resume_callbacks(backup, info.name, model, record_backup) if backup else ([], 0)
    started = time.perf_counter()
    fit = model.fit(
        train_input,
        validation_data=val_ds,
        epochs=config.train.epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps if asynchronous else None,
        callbacks=[startup, timer, DivergenceGuard(), *callbacks, *resume],
        verbose=2,
    )
    seconds = time.perf_counter() - started
    history = _epochs(fit.history, fit.epoch)
    resumed_at = history[0]["epoch"] - 1 if history else config.train.epochs
    restored = restored_history(backup, resumed_at + 1) if backup is not None and record_backup else []
    history = restored + history
    seconds += sum(row["epoch_seconds"] for row in restored)  # the restored epochs' training time
    train_time = sum(row["epoch_seconds"] for row in history)
    steady, first_overhead = steady_state(history)
    return TrainResult(
        model=model,
        history=history,
        global_batch_size=global_batch,
        learning_rate=learning_rate,
        warmup_steps=warmup_steps,
        steps_per_epoch=steps,
        traces={"train": _tracing_count(model, "train_function"), "test": _tracing_count(model, "test_function")},
        train_seconds=seconds,
        samples_per_second=steps * global_batch * len(history) / train_time,
        resumed_at_epoch=resumed_at if backup is not None else 0,
        steady_epoch_seconds=steady,
        first_epoch_overhead=first_overhead,
        steady_samples_per_second=steps * global_batch / steady,
        startup_seconds=startup.seconds,
    )


#: Strategies tf_keras ``BackupAndRestore`` accepts; the others get a plain checkpoint.
BACKUP_AND_RESTORE_STRATEGIES = ("default", "mirrored", "multi_worker_mirrored", "parameter_server", "tpu")


def resume_callbacks(backup: RunBackup, strategy: str, model: Any, record: bool) -> tuple[list[Any], int]:
    """Callbacks that back the run up every epoch, and the epoch ``fit`` starts from.

    Args:
        backup: where to back up.
        strategy: the strategy name (decides the backup mechanism).
        model: the compiled model (for the plain checkpoint).
        record: whether this process writes ``state.json`` (the chief).

    Returns:
        The callbacks to pass to ``fit`` *last* (after the ones that complete an
        epoch's logs), and ``initial_epoch`` for ``fit``.
    """
    callbacks: list[Any] = [_ResumeAnnouncer(backup.folder)]
    if record:
        callbacks.append(_HistoryRecorder(backup))
    keras_dir = backup.folder / "keras"
    if strategy in BACKUP_AND_RESTORE_STRATEGIES:
        callbacks.append(keras.callbacks.BackupAndRestore(str(keras_dir), save_freq="epoch", delete_checkpoint=False))
        return callbacks, 0
    checkpoint = _EpochCheckpoint(model, keras_dir)
    callbacks.append(checkpoint)
    return callbacks, checkpoint.restore()


class _ResumeAnnouncer(keras.callbacks.Callback):
    """Says once, at the first epoch, whether and from where the run resumes."""

    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder
        self.first_epoch: int | None = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.first_epoch is None:
            self.first_epoch = epoch
            if epoch:
                resume_log.info("resuming from the backup in %s: epochs 1-%d are done, continuing at epoch %d",
                         self.folder, epoch, epoch + 1)


class _HistoryRecorder(keras.callbacks.Callback):
    """Writes each epoch's logs to ``state.json`` before the model backup of that epoch."""

    def __init__(self, backup: RunBackup):
        super().__init__()
        self.backup = backup

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.backup.record_epoch({"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}})


class _EpochCheckpoint(keras.callbacks.Callback):
    """Model, optimizer and epoch in a ``tf.train.Checkpoint``, for strategies BackupAndRestore refuses."""

    def __init__(self, model: Any, folder: Path):
        super().__init__()
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, epoch=self.epoch)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(folder), max_to_keep=1)

    def restore(self) -> int:
        """Restore the latest checkpoint if there is one; return the epochs it had finished."""
        if self.manager.latest_checkpoint:
            self.checkpoint.restore(self.manager.latest_checkpoint).assert_existing_objects_matched()
        return int(self.epoch.numpy())

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch.assign(epoch + 1)
        self.manager.save()


def _tracing_count(model: keras.Model, attribute: str) -> int:
    """How often Keras traced ``model.<attribute>`` (0 if it never ran or is not a tf.function)."""
    function = getattr(model, attribute, None)
    count = getattr(function, "experimental_get_tracing_count", None)
    return int(count()) if count else 0


def _epochs(history: dict[str, list[float]], epochs: list[int]) -> list[dict[str, float]]:
    rows = []
    for i, epoch in enumerate(epochs):
        row = {"epoch": epoch + 1}
        row.update({key: float(history[key][i]) for key in EPOCH_COLUMNS[1:] + CUSTOM_LOOP_COLUMNS if key in history})
        rows.append(row)
    return rows


def weights_digest(model: keras.Model) -> str:
    """SHA-256 of the model's weights: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for array in trained_weights(model):
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()
