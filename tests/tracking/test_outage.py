"""The chief's writes wait out a store that stopped answering, and give up in time, keeping what was not sent."""

from __future__ import annotations

import time

import mlflow
import pytest
import requests
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, INVALID_PARAMETER_VALUE

from tfdist.resume.outbox import MetricsOutbox
from tfdist.tracking.outage import Patience, StoreUnreachable, unreachable

from helpers.servers import free_ports


def test_metrics_for_a_store_that_does_not_answer_are_kept_and_the_flush_gives_up_in_time(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    (port,) = free_ports()  # nothing listens: every request is refused
    mlflow.set_tracking_uri(f"http://127.0.0.1:{port}")
    patience = Patience(2.0, f"http://127.0.0.1:{port}")
    outbox = MetricsOutbox("0123456789abcdef", patience)
    outbox.put({"loss": 0.5, "accuracy": 0.9}, step=1)
    outbox.put({"loss": 0.4}, step=2)
    started = time.monotonic()
    with pytest.raises(StoreUnreachable, match="the epochs' metrics"):
        outbox.flush()
    assert time.monotonic() - started < 30  # 2 s of patience after the first refusal, with room for a loaded machine
    outbox.close()
    assert [(key, value, step) for key, value, _, step in outbox.unsent()] == [
        ("loss", 0.5, 1), ("accuracy", 0.9, 1), ("loss", 0.4, 2)]
    assert patience.down


def test_a_write_is_retried_until_the_store_answers_and_the_outage_ends():
    patience, attempts = Patience(30.0, "the store"), []

    def log_model():
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise requests.exceptions.ConnectionError("Connection refused")
        return "logged"

    assert patience.call(log_model, "the model") == "logged"
    assert len(attempts) == 3 and not patience.down


def test_a_store_that_says_no_is_not_an_outage():
    refused = MlflowException("Invalid value for metric", error_code=INVALID_PARAMETER_VALUE)
    assert not unreachable(refused)
    assert unreachable(MlflowException("API request to http://x/api failed with exception Max retries exceeded"))
    assert unreachable(MlflowException("Internal error", error_code=INTERNAL_ERROR))
    with pytest.raises(MlflowException, match="Invalid value"):
        Patience(30.0, "the store").call(lambda: (_ for _ in ()).throw(refused), "the summary metrics")
