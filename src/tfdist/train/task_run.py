"""The training every task of a run does (the chief's, or another worker's), as phases around ``fit``.

In the spirit of orbit's Controller: the step (Keras's, or the custom loop's
``train_step``) is :mod:`tfdist.train.fit`'s; :class:`TaskRun` owns everything
around it, one method per phase, each testable on its own:

1. :meth:`TaskRun.start`: build the strategy, first thing (logical devices freeze after the first op);
2. :meth:`TaskRun.load`: the prepared splits and this run's backup (resume after a crash);
3. :meth:`TaskRun.fit`: train, backing up every epoch.

The phases are played in order by :mod:`tfdist.train.phases`: the chief (or
only) process hands what it trains to a recorder; another worker of a cluster
trains and leaves a record in a scratch folder, and never imports MLflow
(seconds of CPU a worker would take from its peers at start-up).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from pathlib import Path

from tfdist.cluster.peer_loss import peers_watched
from tfdist.cluster.rendezvous import wait_for_peers
from tfdist.config.knobs import Config
from tfdist.data.prepared import SPEC_FILE, DataSpec, Split, load_spec, load_split
from tfdist.distribute.builders import StrategyInfo, build_strategy
from tfdist.distribute.cluster_spec import ClusterTask
from tfdist.distribute.registry import StrategySpec
from tfdist.records.run_names import RunPaths
from tfdist.resume.backup import RunBackup, open_backup, run_key
from tfdist.resume.checkpoints import Moments
from tfdist.tf_imports import keras, tf
from tfdist.tf_private import configure_collective_coordination
from tfdist.train import collectives
from tfdist.train.checks import applied_compression
from tfdist.train.fit import STEPS_ALONE, TrainResult, step_alone, train_model
from tfdist.train.server import serve_profiler

log = logging.getLogger(__name__)


class TaskRun:
    """Train model ``name`` with strategy ``spec`` in this process, alone or as cluster task ``task``."""

    #: Set by :meth:`start`.
    strategy: tf.distribute.Strategy
    info: StrategyInfo
    #: Set by :meth:`load`.
    data: DataSpec
    train_split: Split
    val_split: Split
    backup: RunBackup

    def __init__(self, config: Config, spec: StrategySpec, name: str, paths: RunPaths, task: ClusterTask | None = None):
        self.config, self.spec, self.name, self.paths, self.task = config, spec, name, paths, task
        self.stale: list[RunBackup] = []
        self.key = ""

    def start(self) -> None:
        """Build the strategy, before any TensorFlow op runs; in a cluster, once every peer is up."""
        distributed = self.config.distributed
        if self.task is None:
            self.strategy, self.info = build_strategy(self.spec, distributed.devices, None, distributed.all_reduce)
            return
        serve_profiler(self.task)
        wait_for_peers(self.task, distributed.connect_timeout)
        if not (self.spec.multi_process and self.spec.synchronous):
            self.strategy, self.info = build_strategy(self.spec, distributed.devices, self.task, distributed.all_reduce)
            return
        # Joining a multi_worker_mirrored cluster is one C++ call during which no Python signal
        # handler runs: SIGTERM and Ctrl-C act as the kernel's defaults meanwhile (the process ends
        # at once; no run is open yet). Joining also installs TensorFlow's SIGTERM preemption
        # notifier, which would swallow the signal: the stage's handlers are put back after it, so a
        # stop while training unwinds (the run ends KILLED) and the peers report it lost.
        interrupt = signal.signal(signal.SIGINT, signal.SIG_DFL)
        terminate = signal.signal(signal.SIGTERM, signal.SIG_DFL)
        configure_collective_coordination(dict(self.task.cluster), distributed.heartbeat_timeout)
        self.strategy, self.info = build_strategy(self.spec, distributed.devices, self.task, distributed.all_reduce)
        signal.signal(signal.SIGINT, interrupt)
        signal.signal(signal.SIGTERM, terminate)

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
        """The prepared files training reads (their bytes are in the backup's key)."""
        return [self.paths.prepared / "train.npz", self.paths.prepared / "val.npz", self.paths.prepared / SPEC_FILE]

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
                                 record_backup=record_backup, moments=moments)
            if not (self.spec.multi_process and self.info.synchronous and self.info.workers > 1):
                return result
            sent = collectives.gradient_bytes(result.model, applied_compression(self.spec, self.config))
            costs = collectives.calibrate(self.strategy, gradient_bytes=sent, workers=self.info.workers,
                                          step_alone=step_alone(self.config, self.data, self.train_split),
                                          steps_alone=STEPS_ALONE)
        log.info("%s: all-reduce between %d workers: %.3f ms latency, %.2f ns per byte", self.name, costs.workers,
                 1e3 * costs.latency_seconds, 1e9 * costs.seconds_per_byte)
        return dataclasses.replace(result, collectives=costs)
