"""The evaluate stage's numbers: test accuracy, loss and per-class precision and recall from predictions."""

import numpy as np
import pytest

from tfdist.data.prepared import MNIST_CLASSES
from tfdist.evaluate.stage import evaluate_predictions


def test_metrics_from_predictions():
    labels = np.array([0, 0, 1, 2])
    probabilities = np.full((4, 10), 0.01)
    for row, predicted in enumerate([0, 1, 1, 2]):
        probabilities[row, predicted] = 0.91
    metrics = evaluate_predictions(probabilities, labels, MNIST_CLASSES)
    assert metrics["accuracy"] == 0.75 and metrics["samples"] == 4
    assert metrics["per_class"]["0"] == {"precision": 1.0, "recall": 0.5, "support": 2}
    assert metrics["per_class"]["1"]["precision"] == 0.5
    assert metrics["per_class"]["9"] == {"precision": 0.0, "recall": 0.0, "support": 0}
    assert metrics["loss"] == pytest.approx(-(3 * np.log(0.91) + np.log(0.01)) / 4)
