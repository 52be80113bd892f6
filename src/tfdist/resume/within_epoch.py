"""Backups within an epoch, and the preemption that asks for one: a long epoch loses at most the interval.

Every ``train.backup_every`` steps (at the first step boundary ``fit`` reaches
after them: ``steps_per_execution`` steps are one call into the runtime), and at
the first boundary after a SIGTERM, the run's model and optimizer (the dropout
masks' step counter is a weight of the model) go into a checkpoint of their own
(``steps/`` in the run's backup folder), and ``steps.json`` says which: the epoch
in progress, the steps done in it, the epoch's metric sums so far and its
training seconds. A rerun resumes there when the epoch-end backup holds the
epochs before it: the model restored, ``fit`` started at the step, the input at
the batch after it (:func:`tfdist.data.input_pipeline.make_dataset`), the
metrics as they were, so the epoch's logged loss and accuracy are the
uninterrupted run's.

tf_keras ``BackupAndRestore(save_freq=N)`` would not do: it counts calls, not
steps (with ``steps_per_execution`` its saved step is the call's first, not its
last), and keeps no metric sums.
"""

from __future__ import annotations

import itertools
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfdist.errors import PREEMPTION_BOUND, Interrupted, Preempted
from tfdist.files import atomic
from tfdist.resume.backup import RunBackup
from tfdist.resume.checkpoints import read_whole
from tfdist.tf_imports import keras, tf
from tfdist.tf_private import (
    build_metrics,
    cluster_key_claim,
    cluster_key_wait,
    end_fit_at,
    start_fit_at,
    write_dirpath,
)

log = logging.getLogger("tfdist.resume")

_STATE = "steps.json"
_OVER = "over"
_FITS = itertools.count()


@dataclass(frozen=True)
class WithinEpoch:
    """Where a step backup stands: ``step`` steps of epoch ``epoch`` (0-based) done, the epoch's metric variables'
    values then (in ``model.metrics`` order), its training seconds so far, and the checkpoint holding the model."""

    epoch: int
    step: int
    metrics: list[list[Any]]
    seconds: float
    checkpoint: str


def step_folder(backup: RunBackup) -> Path:
    return backup.folder / "steps"


def within_epoch(backup: RunBackup, done_epochs: int, steps: int) -> WithinEpoch | None:
    """The step backup a rerun resumes from: one inside epoch ``done_epochs`` (the first the epoch-end backup has
    not finished), short of its ``steps``, whose checkpoint is there; None otherwise (an older one is stale)."""
    try:
        state = json.loads((step_folder(backup) / _STATE).read_text())
        found = WithinEpoch(int(state["epoch"]), int(state["step"]), list(state["metrics"]), float(state["seconds"]),
                            str(state["checkpoint"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("the backup within an epoch in %s is unreadable (%s): resuming from the epoch's start",
                    step_folder(backup), err)
        return None
    if found.epoch != done_epochs or not 0 < found.step < steps:
        return None
    damage = read_whole(str(step_folder(backup) / found.checkpoint))
    if isinstance(damage, str):
        log.warning("the backup within an epoch in %s is unreadable (%s): resuming from the epoch's start",
                    step_folder(backup), damage)
        return None
    return found


class StepBackup(keras.callbacks.Callback):
    """Backs the run up every ``every`` steps within an epoch (0: never) and when ``preemption`` is requested, then
    ends the run as preempted; resumes from ``resume`` (:func:`within_epoch`) when given.

    ``record``: this process writes ``steps.json`` (the chief); every process of
    a synchronous cluster saves the checkpoint at the same step (the others into
    a scratch folder), as reading the metrics' sums takes them all.
    ``clock`` gives the epoch's training seconds so far; ``moments`` is told
    ``backup.step`` between the checkpoint and ``steps.json`` (the chief's).
    """

    def __init__(self, model: Any, backup: RunBackup, every: int, *, record: bool, clock: Callable[[], float],
                 preemption: Preemption | None = None, resume: WithinEpoch | None = None,
                 moments: Callable[[str], None] | None = None):
        super().__init__()
        self.every, self.record, self.clock, self.preemption, self.resume = every, record, clock, preemption, resume
        self.moments = moments or (lambda moment: None)
        self.folder = step_folder(backup)
        self.checkpoint = tf.train.Checkpoint(model=model)
        self._epoch, self._last, self._calls = 0, 0, 0
        self._metrics_to_restore: list[list[Any]] | None = None
        self._supports_tf_logs = True  # it reads no logs: Keras need not turn them into numbers every call

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.resume is None:
            return
        # After the epoch-end backup's own restore (its callback runs first): the step's model wins.
        self.checkpoint.read(str(self.folder / self.resume.checkpoint)).assert_existing_objects_matched()
        build_metrics(self.model)  # fit builds them at its first step: too late to hold the epoch's sums
        start_fit_at(self.model, self.resume.epoch, self.resume.step)
        self._metrics_to_restore = self.resume.metrics
        log.info("resuming within epoch %d: its steps 1-%d are done, continuing at step %d", self.resume.epoch + 1,
                 self.resume.step, self.resume.step + 1)

    def on_train_end(self, logs: dict | None = None) -> None:
        end_fit_at(self.model)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch, self._last = epoch, 0
        if self._metrics_to_restore is not None and self.resume is not None:  # fit reset them as the epoch began
            saved, self._metrics_to_restore = self._metrics_to_restore, None
            self._last = self.resume.step
            for metric, values in zip(self.model.metrics, saved, strict=True):
                for variable, value in zip(metric.variables, values, strict=True):
                    variable.assign(tf.constant(value, dtype=variable.dtype))

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        done = batch + 1  # fit passes the execution's last step
        self._calls += 1
        preempted = self.preemption is not None and self.preemption.due(self._calls)
        if done >= self.params["steps"]:  # the epoch-end backup comes next: a preemption backs up a boundary later
            return
        if preempted or (self.every and done - self._last >= self.every):
            self._save(done)
            self._last = done
        if preempted:
            raise Preempted(f"backed up at epoch {self._epoch + 1}, step {done}")

    def _save(self, done: int) -> None:
        metrics = [[variable.numpy().tolist() for variable in metric.variables] for metric in self.model.metrics]
        seconds = self.clock()
        folder = write_dirpath(self.folder, self.model.distribute_strategy)
        tf.io.gfile.makedirs(folder)
        prefix = self.checkpoint.write(str(Path(folder) / f"step-{self._epoch}-{done}"))
        if not self.record:
            tf.io.gfile.rmtree(folder)
            return
        self.moments("backup.step")
        atomic.write_json(self.folder / _STATE, {"epoch": self._epoch, "step": done, "metrics": metrics,
                                                  "seconds": seconds, "checkpoint": Path(prefix).name})
        for old in self.folder.glob("step-*"):  # the checkpoint before: steps.json names this one now
            if not old.name.startswith(Path(prefix).name + "."):
                old.unlink(missing_ok=True)


class StopWhenPreempted(keras.callbacks.Callback):
    """A parameter_server coordinator's answer to a preemption: its backups are the epochs' ends (Keras schedules
    every epoch of a coordinated ``fit`` from its first step), so it stops at the next step it schedules, or once
    the epoch in flight is backed up (its steps are scheduled well ahead of the workers), and the rerun resumes from
    the last epoch backed up."""

    def __init__(self, preemption: Preemption, done_epochs: int):
        super().__init__()
        self.preemption, self.done_epochs = preemption, done_epochs
        self._supports_tf_logs = True  # its logs are remote values: reading them would wait for the workers

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.done_epochs = epoch + 1  # after the epoch's backup: its callback runs first
        self._stop_if_preempted()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._stop_if_preempted()

    def _stop_if_preempted(self) -> None:
        if self.preemption.due(0):
            raise Preempted(f"backed up at the end of epoch {self.done_epochs} (parameter_server backs up at epoch "
                            "ends)" if self.done_epochs else "nothing backed up yet (parameter_server backs up at "
                            "epoch ends)")


class Preemption:
    """SIGTERM while ``fit`` runs, taken as a scheduler's notice: :attr:`requested`, and :class:`StepBackup` backs
    up at the next step boundary and ends the run as preempted. A second SIGTERM, or :data:`PREEMPTION_BOUND`
    seconds without that backup, ends the process at once (:class:`~tfdist.errors.Interrupted`) with what the last
    backup holds. SIGINT keeps its meaning."""

    def __init__(self, bound: int = PREEMPTION_BOUND):
        self.bound = bound
        self.requested = False

    def due(self, boundary: int) -> bool:
        """Whether to back up and stop at step boundary number ``boundary`` of this ``fit`` (counted from 1)."""
        return self.requested

    def close(self) -> None:
        """``fit`` is over."""

    def _on_term(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise Interrupted(signum, "a second SIGTERM while backing up")
        self.requested = True
        signal.alarm(self.bound)
        log.warning("SIGTERM: backing up at the next step, then exiting (within %d s; a second SIGTERM exits now)",
                    self.bound)

    def _on_alarm(self, signum: int, frame: Any) -> None:
        raise Interrupted(signal.SIGTERM, f"no step boundary came within {self.bound} s of it")

    @contextmanager
    def listening(self) -> Iterator[Preemption]:
        """SIGTERM is this preemption's inside the block (and the alarm its bound), the stage's again after it."""
        previous = signal.signal(signal.SIGTERM, self._on_term), signal.signal(signal.SIGALRM, self._on_alarm)
        try:
            yield self
        finally:
            self.close()
            signal.alarm(0)
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGALRM, previous[1])


def preemption_for(strategy: Any, multi_process: bool) -> Preemption:
    """SIGTERM as preemption for a ``fit`` under ``strategy``: this process's own, or, for a task of a synchronous
    cluster, agreed with its peers (:class:`ClusterPreemption`)."""
    if not multi_process:
        return Preemption()
    resolver = strategy.cluster_resolver
    tasks = [f"{job}:{index}" for job, addresses in resolver.cluster_spec().as_dict().items()
             for index in range(len(addresses))]
    return ClusterPreemption(tasks, f"{resolver.task_type}:{resolver.task_id}", next(_FITS))


class ClusterPreemption(Preemption):
    """Preemption agreed by every worker of a synchronous cluster (multi_worker_mirrored): all back up at one step
    boundary, however many of them got the SIGTERM (a scheduler signals every task, or evicts one).

    As TensorFlow's PreemptionCheckpointHandler does, through the coordination
    service's key-value store: the first worker to reach a boundary after its
    SIGTERM claims the preemption and names the next boundary; a thread in
    every worker waits for that name and acknowledges it; the claimant goes on
    once all have (at most ``bound`` / 2 seconds). Workers are never more than
    one boundary apart (each step's all-reduce waits for all), so none is past
    it. ``fit_number`` keeps one ``fit``'s keys apart from the next's in the
    same cluster (the same on every worker: they run the same fits in order).
    """

    def __init__(self, tasks: list[str], me: str, fit_number: int, bound: int = PREEMPTION_BOUND):
        super().__init__(bound)
        self.tasks, self.me = tasks, me
        self.prefix = f"tfdist/preemption/{fit_number}"
        self.target: int | None = None
        self._claimed = False
        self._watcher = threading.Thread(target=self._watch, name="preemption-watcher", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        value = cluster_key_wait(f"{self.prefix}/boundary")
        if value is None or value == _OVER:
            return
        self.target = int(value)
        cluster_key_claim(f"{self.prefix}/seen/{self.me}", "1")

    def due(self, boundary: int) -> bool:
        if self.requested and not self._claimed and self.target is None:
            self._claimed = True
            if cluster_key_claim(f"{self.prefix}/claim", self.me, self.bound / 4):
                self._announce(boundary + 1)
        return self.target is not None and boundary >= self.target

    def _announce(self, boundary: int) -> None:
        cluster_key_claim(f"{self.prefix}/boundary", str(boundary), self.bound / 4)
        deadline = time.monotonic() + self.bound / 2
        for task in self.tasks:
            if cluster_key_wait(f"{self.prefix}/seen/{task}", max(0.001, deadline - time.monotonic())) is None:
                log.warning("preemption: %s did not acknowledge backing up at boundary %d; going on", task, boundary)
        log.info("preemption: every task backs up at step boundary %d", boundary)

    def close(self) -> None:
        if self._watcher.is_alive():  # releases every watcher still waiting
            cluster_key_claim(f"{self.prefix}/boundary", _OVER, 2.0)

