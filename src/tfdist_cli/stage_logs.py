"""What a stage's log shows: its own lines and Keras's, not the libraries' chatter nor their expected warnings."""

from __future__ import annotations

import logging
import warnings


def configure_stage_logging() -> None:
    """Logging as a stage shows it: INFO lines of its own, the libraries' warnings and errors once each."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", force=True)
    # TensorFlow's own INFO lines (one per all-reduce, per closure) drown the stage's.
    for noisy in ("tensorflow", "absl"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # A tracking store that does not answer: tfdist.tracking.outage says so once, not per retried request.
    for noisy in ("urllib3.connectionpool", "mlflow.system_metrics.system_metrics_monitor"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    # MLflow logs each database error with its traceback before raising it; the raised one is reported here.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    # Warnings ParameterServer training gives for what it is meant to do here: in-memory per-worker
    # datasets, and a backup each epoch (whose saver TensorFlow traces anew, and calls that retracing).
    logging.getLogger("tensorflow").addFilter(_not_parameter_server_noise)
    logging.getLogger("tensorflow").addFilter(_coordinator_errors_on_one_line)
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options across serialization")


def _not_parameter_server_noise(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not (message.startswith("Found source dataset of type")
                or ("MultiDeviceSaver.save" in message and "triggered tf.function retracing" in message))


def _coordinator_errors_on_one_line(record: logging.LogRecord) -> bool:
    """A parameter_server coordinator's report of a failed remote step, in one line instead of twenty.

    Its first line says where, the first UNAVAILABLE or connection line says why;
    the stack of graph nodes between says nothing a user can act on.
    """
    if not record.pathname.endswith("cluster_coordinator.py") or record.levelno < logging.ERROR:
        return True
    lines = [line.strip() for line in record.getMessage().splitlines() if line.strip()]
    why = next((line for line in lines[1:] if "UNAVAILABLE" in line or "connect" in line or "CANCELLED" in line), "")
    record.msg, record.args = " ".join(filter(None, [lines[0] if lines else "", why])), ()
    return True
