"""The evaluate stage: test-set metrics and the confusion matrix of every trained model, onto each one's MLflow run.

One process evaluates them all: an evaluation is quick beside the process's
TensorFlow and MLflow imports and store set-up, which a stage per model would
pay once each (docs/performance.md, "Start-up").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfdist.config.knobs import Config
from tfdist.data.prepared import DataSpec, PreparedSplit, Split, load_spec, load_split, scaled
from tfdist.records.measures import mlflow_metrics
from tfdist.records.reports import EvalReport, TrainReport, from_dict, read_report
from tfdist.resume import rerun
from tfdist.tracking import experiment, models

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    """One model's result on the test split: its report, and the true and predicted labels (the confusion matrix)."""

    report: EvalReport
    actual: np.ndarray
    predicted: np.ndarray
    class_names: tuple[str, ...]

    def confusion_rows(self) -> list[dict[str, str]]:
        """``confusion/NAME.csv``'s rows: each test image's actual and predicted class, by name."""
        return [{"actual": self.class_names[a], "predicted": self.class_names[p]}
                for a, p in zip(self.actual, self.predicted, strict=True)]


def evaluate(config: Config, names: list[str], *, prepared_dir: Path, models_dir: Path, train_reports: Path
             ) -> list[Evaluation]:
    """Evaluate every model in ``names`` (``models_dir/NAME``) on the test split, logging each onto its training run.

    Every model and train report is checked before any is evaluated, so a
    missing one fails the stage at once, naming it.

    Raises:
        InputError: a model folder or train report is missing or unreadable.
    """
    data = load_spec(prepared_dir)
    test = load_split(prepared_dir, "test", data)
    run_ids = {name: read_report(train_reports / f"{name}.json", TrainReport).mlflow_run_id for name in names}
    for name in names:
        models.check_model(models_dir / name)
    experiment.configure(config.mlflow)
    results = []
    labels = test_labels(test)
    for name in names:
        metrics, predicted = evaluate_model(models.load_model(models_dir / name), test, data, labels=labels)
        report = from_dict(EvalReport, {"name": name, **metrics}, name)
        if run_ids[name]:
            rerun.log_missing_metrics(mlflow_metrics(report), run_id=run_ids[name])
        log.info("%s: test accuracy %.4f, loss %.4f on %d images", name, report.accuracy, report.loss, len(test))
        results.append(Evaluation(report, labels, predicted, data.class_names))
    return results


def evaluate_predictions(probabilities: np.ndarray, labels: np.ndarray, class_names: tuple[str, ...]) -> dict[str, Any]:
    """Loss, accuracy and per-class precision/recall, each class by its name.

    Computed in NumPy from the predicted probabilities, so the numbers do not
    depend on how (or whether) the loaded model was compiled.
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    predicted = probabilities.argmax(axis=1)
    classes = len(class_names)
    confusion = np.zeros((classes, classes), dtype=np.int64)
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
            name: {
                "precision": _ratio(true_positive[c], predicted_count[c]),
                "recall": _ratio(true_positive[c], actual_count[c]),
                "support": int(actual_count[c]),
            }
            for c, name in enumerate(class_names)
        },
    }


def test_labels(test: PreparedSplit) -> np.ndarray:
    """The test split's labels, in file order (read without its pixels' decoding)."""
    return np.fromiter((label for _, label in test.records()), dtype=np.int64, count=len(test))


def evaluate_model(model: Any, test: PreparedSplit | Split, data: DataSpec, batch_size: int = 1024, *,
                   labels: np.ndarray | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """Evaluate ``model`` on ``test`` (of ``data``), streamed from its files (or held, a :class:`Split`); return the
    metrics and the predicted labels. ``labels``: the split's, if read already (:func:`test_labels`)."""
    if isinstance(test, Split):
        probabilities, labels = model.predict(scaled(test.x), batch_size=batch_size, verbose=0), test.y
    else:
        from tfdist.data.input_pipeline import make_ordered
        from tfdist.tf_imports import tf

        images = make_ordered(test, batch_size).map(lambda x, y: x, num_parallel_calls=tf.data.AUTOTUNE)
        probabilities = model.predict(images, verbose=0)
        labels = test_labels(test) if labels is None else labels
    return evaluate_predictions(probabilities, labels, data.class_names), probabilities.argmax(axis=1)


def _ratio(numerator: int, denominator: int) -> float:
    return float(numerator / denominator) if denominator else 0.0
