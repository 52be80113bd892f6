"""What ``fit`` runs with besides the model: per-epoch timing, the input's share, start-up timing, warm-up, the
divergence guard.

Callbacks and a schedule only, each per epoch or in-graph: batch-level
callbacks cost Python on every step and ParameterServer refuses them.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import psutil

from tfdist.errors import RunError
from tfdist.tf_imports import keras, tf


class EpochTimer(keras.callbacks.Callback):
    """Adds ``epoch_seconds`` and ``samples_per_second`` (training part only) to epoch logs.

    It must run before callbacks that log the epoch, so they see both values.
    Validation time is left out: it would penalise runs with larger val splits.
    """

    def __init__(self, samples_per_epoch: int, earlier_seconds: float = 0.0):
        """``earlier_seconds``: the first epoch's training time before this ``fit`` (a run resumed within it)."""
        super().__init__()
        self.samples_per_epoch = samples_per_epoch
        self._start = self._train_end = 0.0
        self._earlier = earlier_seconds

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start = time.perf_counter() - self._earlier
        self._earlier = self._train_end = 0.0

    def elapsed(self) -> float:
        """The epoch's training seconds so far."""
        return time.perf_counter() - self._start

    def on_test_begin(self, logs: dict | None = None) -> None:
        if not self._train_end:
            self._train_end = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        seconds = (self._train_end or time.perf_counter()) - self._start
        if logs is not None:
            logs["epoch_seconds"] = seconds
            logs["samples_per_second"] = self.samples_per_epoch / seconds


class InputWait(keras.callbacks.Callback):
    """Adds ``input_share`` to epoch logs: the share of the epoch's training time its steps waited for their batch
    (:meth:`tfdist.train.models.ReadsMetricsOncePerExecution.time_input_waits`; the iterator's hand-over, timed in
    the graph). After :class:`EpochTimer`, before the callbacks that log the epoch.

    Where this process's steps are not timed (one step per call into the runtime, ParameterServer's workers) the
    share is left out.
    """

    def __init__(self, waited: Any):
        super().__init__()
        self.waited = waited
        self._start = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start = float(self.waited.numpy())

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        waited = float(self.waited.numpy()) - self._start
        if logs is not None and waited > 0 and logs.get("epoch_seconds"):
            logs["input_share"] = min(1.0, waited / logs["epoch_seconds"])


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


class Diverged(RunError):
    """The loss became NaN or infinite; ``epoch`` (1-based) and ``step`` say when."""

    def __init__(self, loss: float, epoch: int, step: int):
        super().__init__(
            f"training diverged: loss is {loss} at epoch {epoch} (step {step}); "
            "lower train.learning_rate or clip gradients (train.clip.method: global_norm)"
        )
        self.epoch, self.step = epoch, step


def process_age() -> float | None:
    """Seconds since this process started, or None where the system does not say."""
    try:
        return time.time() - psutil.Process().create_time()
    except psutil.Error:
        return None


class StartupTimer(keras.callbacks.Callback):
    """Records how long the process took to reach ``fit``: the stage's start-up cost."""

    seconds: float | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.seconds = process_age()


def steady_state(history: list[dict[str, float]]) -> tuple[float, float]:
    """``(steady epoch seconds, first-epoch overhead)`` from per-epoch training times; zeros for no epoch.

    No epoch: a worker that resumed a backup holding every epoch trained none,
    and keeps no history (the chief's backup does).
    """
    seconds = [row["epoch_seconds"] for row in history]
    if not seconds:
        return 0.0, 0.0
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
