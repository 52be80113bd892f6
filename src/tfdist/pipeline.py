"""What each stage does, end to end: the stage scripts call one function here.

These functions join the pieces (data, strategy, training, evaluation,
reporting) with tracking, and return what the stage writes. Outputs that must
exist while the MLflow run is open (the saved model) are written here, atomically.
"""

from __future__ import annotations

import logging
import platform
from pathlib import Path
from typing import Any

from tfdist import atomic
from tfdist.config import Config, to_flat_dict
from tfdist.data import PreparedData, load_split, prepare, save_prepared, summarize
from tfdist.reporting import build_comparison, plot_figures, read_history, read_json, render_markdown

log = logging.getLogger(__name__)


def preprocess(config: Config, prepared_dir: Path, cache_dir: Path | None = None) -> dict[str, Any]:
    """Prepare the configured source into ``prepared_dir``; return the data summary."""
    data: PreparedData = prepare(config.data, config.seed, cache_dir)
    save_prepared(data, prepared_dir)
    summary = summarize(data)
    log.info("prepared %s: %s", data.source, {k: v["total"] for k, v in summary["splits"].items()})
    return summary


def train(config: Config, strategy_name: str, name: str, prepared_dir: Path, model_dir: Path) -> tuple[dict, list[dict]]:
    """Train one model under ``strategy_name`` as MLflow run ``name``.

    The strategy is made first, before any TensorFlow op, so logical CPU
    devices can still be configured; the tracking store is checked before
    training so a bad URI fails in seconds.

    Returns:
        The train report and the per-epoch history.
    """
    from tfdist.strategies import make_strategy

    strategy, info = make_strategy(strategy_name, config.distributed.devices)
    train_split, val_split = load_split(prepared_dir, "train"), load_split(prepared_dir, "val")

    from tfdist import tracking
    from tfdist.runtime import keras, tf
    from tfdist.training import train_model

    tracking.configure(config.mlflow)
    params = {**to_flat_dict(config), "strategy": info.to_dict(), "tensorflow": tf.__version__, "tf_keras": keras.__version__}
    tags = {"strategy": info.name, "stage": "train", "model_name": name, "synchronous": str(info.synchronous)}
    with tracking.start_run(name, params, tags) as run_id:
        result = train_model(config, strategy, info, train_split, val_split, [tracking.EpochMetricsLogger()])
        example = train_split.x[:5]
        with atomic.atomic_path(model_dir) as tmp:
            tracking.save_model(result.model, tmp, example, log_to_run=config.mlflow.log_models)
        summary = {
            "train_seconds": result.train_seconds,
            "samples_per_second": result.samples_per_second,
            "global_batch_size": result.global_batch_size,
        }
        tracking.log_metrics(summary)
    report = {
        "name": name,
        **{k: v for k, v in info.to_dict().items() if k != "name"},
        "strategy": info.name,
        "global_batch_size": result.global_batch_size,
        "learning_rate": result.learning_rate,
        "epochs": len(result.history),
        "steps_per_epoch": result.steps_per_epoch,
        "train_seconds": result.train_seconds,
        "samples_per_second": result.samples_per_second,
        **result.final(),
        "mlflow_run_id": run_id,
        "tensorflow": tf.__version__,
        "host": platform.node(),
    }
    return report, result.history


def evaluate(config: Config, name: str, prepared_dir: Path, model_dir: Path, train_report: Path) -> tuple[dict, Any, Any]:
    """Evaluate model ``name`` on the test split and log the result onto its run.

    Returns:
        The eval report, the true labels and the predicted labels.
    """
    from tfdist import tracking
    from tfdist.evaluation import evaluate_model

    test = load_split(prepared_dir, "test")
    run_id = read_json(train_report).get("mlflow_run_id")
    tracking.configure(config.mlflow)
    model = tracking.load_model(model_dir)
    metrics, predicted = evaluate_model(model, test)
    if run_id:
        tracking.log_metrics({"test_loss": metrics["loss"], "test_accuracy": metrics["accuracy"]}, run_id=run_id)
    log.info("%s: test accuracy %.4f, loss %.4f on %d digits", name, metrics["accuracy"], metrics["loss"], len(test))
    return {"name": name, **metrics}, test.y, predicted


def compare(config: Config, names: list[str], train_dir: Path, eval_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Compare runs ``names`` into ``out_dir`` (json, markdown, figures) and log a compare run."""
    train_reports = {n: read_json(train_dir / f"{n}.json") for n in names}
    eval_reports = {n: read_json(eval_dir / f"{n}.json") for n in names}
    histories = {n: read_history(train_dir / "history" / f"{n}.csv") for n in names}
    comparison = build_comparison(train_reports, eval_reports)
    with atomic.atomic_path(out_dir) as tmp:
        figures = plot_figures(comparison, histories, tmp / "figures")
        atomic.write_json(tmp / "compare.json", comparison)
        atomic.write_text(tmp / "compare.md", render_markdown(comparison))
        _track_comparison(config, comparison, [tmp / "compare.json", tmp / "compare.md"], figures)
    log.info("%s", comparison["verdict"])
    return comparison


def _track_comparison(config: Config, comparison: dict, files: list[Path], figures: list[Path]) -> None:
    from tfdist import tracking

    tracking.configure(config.mlflow)
    runs = comparison["runs"]
    params = {"compared": ",".join(runs), "cpu_count": comparison["cpu_count"]}
    tags = {"stage": "compare", "compared_run_ids": ",".join(r["mlflow_run_id"] or "" for r in runs.values())}
    with tracking.start_run("compare", params, tags):
        tracking.log_metrics({
            f"{name}.{key}": row[key]
            for name, row in runs.items()
            for key in ("train_seconds", "samples_per_second", "speedup", "test_accuracy")
        })
        tracking.log_artifacts(files)
        tracking.log_artifacts(figures, "figures")
