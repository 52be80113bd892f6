"""When the tracking store stops answering mid-run: the chief's writes wait for it, up to ``mlflow.outage_timeout``.

A server restarting, a database failing over, the object store behind the
server down for a minute: none of it should cost a training. Epoch metrics go
through :class:`tfdist.resume.outbox.MetricsOutbox`, a thread off the training path that keeps what
the store did not take and sends it, with its original timestamps, once the
store answers again. The run's last writes (the model, the summary metrics,
its end) go through :meth:`Patience.call`, which retries them.

Training goes on through an outage; once it is over, the stage waits up to
``mlflow.outage_timeout`` seconds for the store. Past that it stops with
:class:`StoreUnreachable`, one line naming what was not recorded, and the
run's backup (the weights, the history, the metrics not yet sent) lets a
rerun finish into the same run without training again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from mlflow.exceptions import MlflowException

from tfdist.errors import RunError
from tfdist.tracking.mlflow_private import request_failed

log = logging.getLogger("tfdist.tracking")

T = TypeVar("T")
#: Seconds between attempts while the store does not answer: doubling from the first to the last.
RETRY_DELAYS = (1.0, 5.0)
#: MLflow's error codes for a store that failed to serve, not a request it refused.
_SERVER_SIDE_CODES = {"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"}


class StoreUnreachable(RunError):
    """The tracking store did not answer for ``mlflow.outage_timeout`` seconds (exit 1)."""


def unreachable(err: BaseException) -> bool:
    """Whether ``err`` says the store did not answer (connection refused or cut, timeout, HTTP 5xx), not that it said no."""
    import requests

    if isinstance(err, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
        return True
    if isinstance(err, requests.exceptions.HTTPError):  # artifact uploads and downloads through the server
        return err.response is not None and err.response.status_code >= 500
    if isinstance(err, MlflowException):
        message = str(err.message)
        if request_failed(message):
            return True  # MLflow's own retries ran out: refused, reset, or 5xx every time
        return err.error_code in _SERVER_SIDE_CODES
    try:
        import sqlalchemy.exc
    except ImportError:
        return False
    return isinstance(err, sqlalchemy.exc.OperationalError)  # a database store that went away


class Patience:
    """The clock of one outage of store ``shown``, shared by every write of the run.

    An outage starts at the first request the store does not answer and ends
    at the next one it does; writes give up once it has lasted ``timeout``
    seconds since it began, or since training ended if it began before.
    """

    def __init__(self, timeout: float, shown: str):
        self.timeout, self.shown = timeout, shown
        self._since: float | None = None
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self._since is not None

    def seconds_left(self) -> float:
        with self._lock:
            return self.timeout if self._since is None else self._since + self.timeout - time.monotonic()

    def failed(self, err: BaseException) -> float:
        """Note a request the store did not answer; the seconds left in this outage."""
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()
                log.warning("the tracking store %s does not answer (%s); training goes on, and its records wait up "
                            "to %.0f s (mlflow.outage_timeout) after it for the store (MLflow's system metrics "
                            "stop here)", self.shown, _reason(err), self.timeout)
        return self.seconds_left()

    def answered(self) -> None:
        with self._lock:
            if self._since is not None:
                log.warning("the tracking store %s answers again after %.0f s", self.shown, time.monotonic() - self._since)
            self._since = None

    def restart_clock(self) -> None:
        """Training has ended: an outage still going on gets the whole timeout from now."""
        with self._lock:
            if self._since is not None:
                self._since = time.monotonic()

    def call(self, action: Callable[[], T], what: str) -> T:
        """``action()``, retried while the store does not answer; StoreUnreachable(``what``) past the timeout."""
        delay = RETRY_DELAYS[0]
        while True:
            try:
                result = action()
            except Exception as err:
                if not unreachable(err):
                    raise
                left = self.failed(err)
                if left <= 0:
                    raise StoreUnreachable(what) from None
                log.info("waiting for the tracking store to record %s (%.0f s left)", what, left)
                time.sleep(min(delay, left))
                delay = min(delay * 2, RETRY_DELAYS[1])
                continue
            self.answered()
            return result


def _reason(err: BaseException) -> str:
    """The first line of what failed, without MLflow's request preamble or urllib3's retry story."""
    text = str(getattr(err, "message", err)).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    for cause in ("Connection refused", "Read timed out", "Connection reset", "Remote end closed", "too many 5",
                  "timed out", "Name or service not known"):
        if cause in text:
            return cause.replace("too many 5", "HTTP 5xx") if cause == "too many 5" else cause
    return text[:200]
