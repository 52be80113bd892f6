"""The training every task of a run does (the chief's, or another worker's), as phases around ``fit``.

In the spirit of orbit's Controller: the step (Keras's, or the custom loop's
``train_step``) is :mod:`tfdist.train.fit`'s; :class:`TaskRun` owns everything
around it, one method per phase, each testable on its own:

1. :meth:`TaskRun.start`: the runtime (threads, oneDNN) and the strategy, first thing (logical devices freeze
   after the first op);
2. :meth:`TaskRun.load`: the prepared splits and this run's backup (resume after a crash);
3. :meth:`TaskRun.fit`: train, backing up every epoch (another worker: :meth:`TaskRun.fit_beside_chief`).

The phases are played in order by :mod:`tfdist.train.phases`: the chief (or
only) process hands what it trains to a recorder; another worker of a cluster
trains and leaves a record in a scratch folder, and never imports MLflow
(seconds of CPU a worker would take from its peers at start-up).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import tempfile
from pathlib import Path

from tfdist.cluster.launcher import SCRATCH_ENV
from tfdist.cluster.peer_loss import peers_watched
from tfdist.cluster.rendezvous import wait_for_peers
from tfdist.config.knobs import Config
from tfdist.data.prepared import SPEC_FILE, DataSpec, PreparedSplit, load_spec, load_split
from tfdist.distribute.builders import StrategyInfo, build_strategy
from tfdist.distribute.cluster_spec import ClusterTask
from tfdist.distribute.registry import StrategySpec
from tfdist.files import atomic
from tfdist.records.run_names import PROFILE_FOLDER, RunPaths
from tfdist.resume.backup import RunBackup, open_backup, run_key
from tfdist.resume.checkpoints import Moments, set_aside_if_damaged
from tfdist.runtime.threads import configure_runtime
from tfdist.tf_imports import keras, tf
from tfdist.train import collectives
from tfdist.train.checks import applied_compression
from tfdist.train.fit import STEPS_ALONE, TrainResult, step_alone, train_model, weights_digest
from tfdist.train.server import serve_profiler

log = logging.getLogger(__name__)


class TaskRun:
    """Train model ``name`` with strategy ``spec`` in this process, alone or as cluster task ``task``."""

    #: Set by :meth:`start`.
    strategy: tf.distribute.Strategy
    info: StrategyInfo
    #: Set by :meth:`load`.
    data: DataSpec
    train_split: PreparedSplit
    val_split: PreparedSplit
    backup: RunBackup

    def __init__(self, config: Config, spec: StrategySpec, name: str, paths: RunPaths, task: ClusterTask | None = None):
        self.config, self.spec, self.name, self.paths, self.task = config, spec, name, paths, task
        self.stale: list[RunBackup] = []
        self.key = ""

    def start(self) -> None:
        """Set the runtime up and build the strategy, before any TensorFlow op runs; in a cluster, once every peer is up."""
        distributed = self.config.distributed
        configure_runtime(self.config, distributed.devices if self.spec.distributes and not self.spec.multi_process else 1)
        if self.task is not None:
            serve_profiler(self.task)
            wait_for_peers(self.task, distributed.connect_timeout)
        self.strategy, self.info = build_strategy(self.spec, distributed.devices, self.task, distributed.all_reduce,
                                                  heartbeat_timeout=distributed.heartbeat_timeout)

    def set_aside_if_damaged(self) -> str | None:
        """Set this run's backup aside when it is damaged (:func:`tfdist.resume.checkpoints.set_aside_if_damaged`);
        the MLflow run it named, to close. The chief's, before the cluster is joined: the other workers read the
        backup only once the chief has joined, so none restores from a damaged one."""
        if not all(path.is_file() for path in self.data_files):  # :meth:`load` names what is missing
            return None
        self.key = self.run_key()  # hashes the prepared data: once, kept for load
        return set_aside_if_damaged(self.paths.backups / self.name / self.key, self.spec.backup)

    def load(self) -> None:
        """What the data is, its training and validation splits, and this run's backup (plus stale ones under other params)."""
        prepared = self.paths.prepared
        self.data = load_spec(prepared)
        self.train_split, self.val_split = load_split(prepared, "train", self.data), load_split(prepared, "val", self.data)
        self.key = self.key or self.run_key()  # the chief hashed the data already, at start
        self.backup, self.stale = open_backup(self.paths.backups, name=self.name, key=self.key)

    def run_key(self) -> str:
        """The key of this run's backup: what decides its result (:func:`tfdist.resume.backup.run_key`)."""
        return run_key(self.config, self.spec.name, self.data_files)

    @property
    def data_files(self) -> list[Path]:
        """The prepared data's ``spec.json``, whose bytes are in the backup's key: it gives every shard's SHA-256."""
        return [self.paths.prepared / SPEC_FILE]

    @functools.cached_property
    def scratch(self) -> Path:
        """Where this task keeps what is not a stage output: the local launcher's scratch folder (its every task's),
        or a folder of its own."""
        return Path(os.environ.get(SCRATCH_ENV) or tempfile.mkdtemp(prefix="tfdist-scratch-"))

    def remove_own_scratch(self) -> None:
        """Remove the scratch folder this task made for itself, if it made one (the launcher's stays for its tasks)."""
        if "scratch" in self.__dict__ and not os.environ.get(SCRATCH_ENV):
            shutil.rmtree(self.scratch, ignore_errors=True)

    @property
    def profile_root(self) -> Path:
        """The folder every task of this run writes its trace into, each in a folder named after it
        (``train.profile_steps``; the chief logs what it finds there to the MLflow run)."""
        return self.scratch / self.name / PROFILE_FOLDER

    def fit(self, callbacks: list[keras.callbacks.Callback] | tuple = (), record_backup: bool = True,
            moments: Moments | None = None) -> TrainResult:
        """Train, backing up every epoch (and resuming from the backup when it holds epochs); ``moments`` is told
        each moment of an epoch's backup.

        Synchronous workers then time the all-reduce between them, together
        (:func:`tfdist.train.collectives.calibrate`): what the compare stage
        projects more machines from.

        Raises:
            RunError: a peer of this cluster task was lost, named in one line (:mod:`tfdist.cluster.peer_loss`).
        """
        with peers_watched(self.task, self.config.distributed.heartbeat_timeout):
            result = train_model(self.config, self.spec, self.strategy, self.info, data=self.data,
                                 train=self.train_split, val=self.val_split, callbacks=callbacks, backup=self.backup,
                                 record_backup=record_backup, moments=moments, profile_dir=self.profile_dir)
            if not (self.spec.multi_process and self.info.synchronous and self.info.workers > 1):
                return result
            sent = collectives.gradient_bytes(result.model, applied_compression(self.spec, self.config))
            costs = collectives.calibrate(self.strategy, gradient_bytes=sent, workers=self.info.workers,
                                          step_alone=step_alone(self.config, self.data, self.train_split),
                                          steps_alone=STEPS_ALONE)
        log.info("%s: all-reduce between %d workers: %.3f ms latency, %.2f ns per byte", self.name, costs.workers,
                 1e3 * costs.latency_seconds, 1e9 * costs.seconds_per_byte)
        return dataclasses.replace(result, collectives=costs)

    @property
    def profile_dir(self) -> Path | None:
        """Where this task's trace goes, with ``train.profile_steps``."""
        return self.profile_root / (self.task.name if self.task else "main") if self.config.train.profile_steps else None

    def fit_beside_chief(self, moments: Moments | None = None) -> None:
        """A worker other than the chief: train beside it (the collectives need it), and keep the weights' digest and
        the history in a scratch folder, outside the stage's outputs."""
        assert self.task is not None, "only a cluster has workers besides its chief"
        result = self.fit(record_backup=False, moments=moments)
        digest = weights_digest(result.model)
        path = self.scratch / self.name / f"{self.task.name}.json"
        atomic.write_json(path, {"task": self.task.name, "weights_sha256": digest, "history": result.history})
        log.info("%s: final weights sha256 %s; not the chief, so saved only %s", self.task.name, digest, path)
