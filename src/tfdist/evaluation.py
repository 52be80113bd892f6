"""Test-set metrics and the confusion matrix of a trained model."""

from __future__ import annotations

from typing import Any

import numpy as np

from tfdist.data import CLASSES, Digits


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
