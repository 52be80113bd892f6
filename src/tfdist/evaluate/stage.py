"""The evaluate stage: test-set metrics and the confusion matrix of a trained model, onto its MLflow run."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from tfdist import tracking
from tfdist.config import Config
from tfdist.data.prepared import CLASSES, Digits, load_split
from tfdist.reports import EvalReport, TrainReport, from_dict, read_report

log = logging.getLogger(__name__)


def evaluate(config: Config, name: str, prepared_dir: Path, model_dir: Path, train_report: Path
             ) -> tuple[EvalReport, np.ndarray, np.ndarray]:
    """Evaluate model ``name`` on the test split and log the result onto its training run.

    Returns:
        The eval report, the true labels and the predicted labels.
    """
    test = load_split(prepared_dir, "test")
    run_id = read_report(train_report, TrainReport).mlflow_run_id
    tracking.configure(config.mlflow)
    model = tracking.load_model(model_dir)
    metrics, predicted = evaluate_model(model, test)
    if run_id:
        tracking.log_metrics({"test_loss": metrics["loss"], "test_accuracy": metrics["accuracy"]}, run_id=run_id)
    log.info("%s: test accuracy %.4f, loss %.4f on %d digits", name, metrics["accuracy"], metrics["loss"], len(test))
    return from_dict(EvalReport, {"name": name, **metrics}, name), test.y, predicted


def evaluate_predictions(probabilities: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """Loss, accuracy and per-class precision/recall.

    Computed in NumPy from the predicted probabilities, so the numbers do not
    depend on how (or whether) the loaded model was compiled.
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    predicted = probabilities.argmax(axis=1)
    confusion = np.zeros((CLASSES, CLASSES), dtype=np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    true_positive = np.diag(confusion)
    predicted_count = confusion.sum(axis=0)
    actual_count = confusion.sum(axis=1)
    picked = probabilities[np.arange(len(labels)), labels]
    return {
        "loss": float(-np.log(np.clip(picked, 1e-7, 1.0)).mean()),
        "accuracy": float(true_positive.sum() / len(labels)),
        "samples": int(len(labels)),
        "per_class": {
            str(c): {
                "precision": _ratio(true_positive[c], predicted_count[c]),
                "recall": _ratio(true_positive[c], actual_count[c]),
                "support": int(actual_count[c]),
            }
            for c in range(CLASSES)
        },
    }


def evaluate_model(model: Any, test: Digits, batch_size: int = 1024) -> tuple[dict[str, Any], np.ndarray]:
    """Evaluate ``model`` on ``test``; return the metrics and the predicted labels."""
    probabilities = model.predict(test.x, batch_size=batch_size, verbose=0)
    return evaluate_predictions(probabilities, test.y), probabilities.argmax(axis=1)


def _ratio(numerator: int, denominator: int) -> float:
    return float(numerator / denominator) if denominator else 0.0
