"""``train.profile_steps``: steady steps of every training process captured in TensorFlow's profiler, each its own trace.

Each process captures itself (``tf.profiler.experimental.start``/``stop``):
no profiler server, so no port opens. The capture starts with the epoch
after the process's first (which traces the step functions) and stops once
``profile_steps`` steps are done; a synchronous cluster's workers step together,
so their traces cover the same steps. Keras calls a callback once a call into
the runtime (``train.steps_per_execution`` steps), so a capture runs to the end
of the call holding its last step. ParameterServer's coordinator refuses
batch-level callbacks: its chief captures the whole epoch, and its workers and
ps tasks, which run no callback, are not captured.

A capture that fails (the profiler busy, a full disk) says so in one line and
the run goes on: a trace is worth less than the training it watches.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tfdist.tf_imports import keras, tf

log = logging.getLogger(__name__)

class ProfileEpoch(keras.callbacks.Callback):
    """Captures epoch ``epoch`` (0-based) of this process into ``logdir`` (ParameterServer's chief: the whole epoch).

    ``captured`` is the steps the trace holds once it is written (0: none).
    """

    def __init__(self, logdir: Path, epoch: int, steps: int):
        super().__init__()
        self.logdir, self.epoch, self.steps = logdir, epoch, steps
        self.captured = 0
        self._running = False

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if epoch == self.epoch and not self.captured:
            self._start()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._stop(self.steps)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._stop(0)  # stopped early (preempted, diverged): nothing steady to keep

    def _start(self) -> None:
        try:
            self.logdir.mkdir(parents=True, exist_ok=True)
            tf.profiler.experimental.start(str(self.logdir))
        except (tf.errors.OpError, OSError) as error:  # AlreadyExists: another profiler runs in this process
            log.warning("profiling: no capture of this task (%s); training goes on", _first_line(error))
            return
        self._running = True

    def _stop(self, steps: int) -> None:
        if not self._running:
            return
        self._running = False
        try:
            tf.profiler.experimental.stop(save=steps > 0)
        except (tf.errors.OpError, OSError) as error:  # the trace could not be written
            log.warning("profiling: this task's trace was not written (%s); training goes on", _first_line(error))
            return
        if steps:
            self.captured = steps
            log.info("profiling: %d steps of epoch %d captured into %s", steps, self.epoch + 1, self.logdir)


class ProfileSteps(ProfileEpoch):
    """Captures the first ``steps`` steps of epoch ``epoch``, to the end of the call holding the last."""

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._running and batch + 1 >= self.steps:
            self._stop(batch + 1)


def profile_callback(steps: int, logdir: Path | None, first_epoch: int, epochs: int, epoch_steps: int,
                     asynchronous: bool) -> ProfileEpoch | None:
    """The capture of ``steps`` steps into ``logdir`` for a fit from ``first_epoch`` to ``epochs`` of ``epoch_steps``:
    in the epoch after the first it trains (asynchronous: all of it); None where it trains one, or none is asked."""
    if not steps or logdir is None:
        return None
    if first_epoch + 1 >= epochs:
        log.info("profiling: this fit trains one epoch, which traces the step functions: nothing steady to capture")
        return None
    if asynchronous:
        return ProfileEpoch(logdir, first_epoch + 1, epoch_steps)
    return ProfileSteps(logdir, first_epoch + 1, steps)


def traces(root: Path) -> list[Path]:
    """Every task's trace under ``root``."""
    return sorted(root.glob("*/plugins/profile/*/*.xplane.pb"))


def _first_line(error: Any) -> str:
    return str(getattr(error, "message", error)).strip().splitlines()[0] if str(error).strip() else type(error).__name__
