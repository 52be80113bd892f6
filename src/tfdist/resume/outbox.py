"""The metrics outbox: each backed-up epoch's metrics, sent to the run without making training wait for the store.

The epochs' rows come from the backup (:mod:`tfdist.resume.backup`), stamped
with the time the backup recorded them, so that a rerun can send them again
and the store keeps one copy of each: the outbox and the backup are one record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from mlflow import MlflowClient
from mlflow.entities import Metric

from tfdist.resume.backup import RunBackup
from tfdist.resume.checkpoints import ResumePoint
from tfdist.tracking.outage import RETRY_DELAYS, Patience, StoreUnreachable, unreachable

#: MLflow takes at most this many metrics in one ``log_batch``.
BATCH_LIMIT = 1000
#: A queued metric: key, value, timestamp (ms), step.
MetricRow = tuple[str, float, int, int]


class MetricsOutbox:
    """Epoch metrics of run ``run_id``, sent by a thread of their own; what the store has not taken yet stays here.

    :meth:`put` never waits for the store. :meth:`unsent` is what a run that
    stops in an outage names as not recorded; :meth:`flush` waits (within the
    outage's patience) until everything is sent.
    """

    def __init__(self, run_id: str, patience: Patience):
        self.run_id, self.patience = run_id, patience
        self._client = MlflowClient()
        self._pending: list[MetricRow] = []
        self._error: BaseException | None = None
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._send, name="tfdist-metrics", daemon=True)
        self._thread.start()

    def put(self, metrics: Mapping[str, float], step: int, timestamp: int | None = None) -> None:
        """Queue ``metrics`` at ``step``, stamped ``timestamp`` (ms, now by default).

        The store keeps one copy of a metric it already has with the same key,
        value, step and timestamp, so putting the same stamped metrics again is harmless.
        """
        timestamp = int(time.time() * 1000) if timestamp is None else timestamp
        with self._changed:
            self._pending.extend((key, float(value), timestamp, step) for key, value in metrics.items())
            self._changed.notify_all()

    def unsent(self) -> list[MetricRow]:
        with self._changed:
            return list(self._pending)

    def flush(self, what: str = "the epochs' metrics") -> None:
        """Wait until every metric is sent; StoreUnreachable once the outage outlasts the timeout."""
        with self._changed:
            while self._pending and self._error is None:
                if self.patience.down and self.patience.seconds_left() <= 0:
                    raise StoreUnreachable(what)
                self._changed.wait(0.2)
            if self._error is not None:
                raise self._error

    def close(self) -> None:
        """Stop the thread (what is unsent stays in :meth:`unsent`)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join(timeout=60)

    def _send(self) -> None:
        delay = RETRY_DELAYS[0]
        while True:
            with self._changed:
                while not self._pending and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                batch = self._pending[:BATCH_LIMIT]
            try:
                self._client.log_batch(self.run_id, metrics=[Metric(*row) for row in batch])
            except Exception as err:
                if not unreachable(err):
                    with self._changed:
                        self._error = err
                        self._changed.notify_all()
                    return
                self.patience.failed(err)
                with self._changed:
                    self._changed.wait_for(lambda: self._closed, timeout=delay)
                delay = min(delay * 2, RETRY_DELAYS[1])
                continue
            self.patience.answered()
            delay = RETRY_DELAYS[0]
            with self._changed:
                del self._pending[:len(batch)]
                self._changed.notify_all()


class TrackedEpochs(ResumePoint):
    """Hands each backed-up epoch to the run's metrics outbox, which never makes training wait for the store.

    It sends the row the backup recorded, with the timestamp recorded with it.
    A resumed run sends its restored epochs again: a crash (or an outage that
    outlasted the stage) may have kept the store from taking them, and the store
    keeps one copy of a metric it already has with the same timestamp.
    """

    def __init__(self, outbox: MetricsOutbox, backup: RunBackup):
        super().__init__()
        self.outbox, self.backup = outbox, backup

    def resumed_at(self, done: int) -> None:
        for epoch in range(1, done + 1):
            self._send(epoch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._send(epoch + 1)

    def _send(self, epoch: int) -> None:
        if recorded := self.backup.epoch_metrics(epoch):
            metrics, timestamp = recorded
            self.outbox.put(metrics, step=epoch, timestamp=timestamp)
