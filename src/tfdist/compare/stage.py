"""The compare stage: read every run's reports, compare them, write the report files, log the compare run.

:mod:`tfdist.compare.compute` computes the comparison, :mod:`tfdist.compare.render`
lays it out; this module joins them with the files DVC tracks and with MLflow.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tfdist.compare.comparison import Comparison, headline_metrics, to_json
from tfdist.compare.compute import Round, build_comparison, training_seconds
from tfdist.compare.render import plot_figures, render_html, render_markdown
from tfdist.config.knobs import Config
from tfdist.distribute.registry import check_pipeline
from tfdist.files import atomic
from tfdist.records.history import read_history
from tfdist.records.measures import mlflow_metrics
from tfdist.records.reports import EvalReport, TrainReport, read_report
from tfdist.records.run_names import planned
from tfdist.resume import rerun
from tfdist.tracking import addresses, experiment, models, runs

log = logging.getLogger(__name__)


#: Per-epoch columns the compare stage gathers from every run for ``dvc plots``.
CURVE_COLUMNS = ("loss", "accuracy", "val_loss", "val_accuracy")


def compare(config: Config, *, train_dir: Path, eval_dir: Path, repeats_dir: Path, out: Path) -> Comparison:
    """Compare normal training with each of ``distributed.strategies`` into folder ``out``; attach it to the execution's run.

    Writes compare.json (everything), compare.md and compare.html (the same
    report), figures/, metrics.json (the headline numbers, for ``dvc exp
    show``) and curves.csv (every run's epochs and their end in training seconds, for ``dvc plots``).
    With ``compare.repeats`` above 1, rounds 2 and on are read from ``repeats_dir`` (the repeat stage's reports).

    Raises:
        StrategyError: ``distributed.strategies`` names a strategy the pipeline cannot run.
        InputError: a report is missing or malformed, naming the file.
    """
    check_pipeline(config.distributed.strategies)
    names = config.run_names
    train_reports = {n: read_report(train_dir / f"{n}.json", TrainReport) for n in names}
    eval_reports = {n: read_report(eval_dir / f"{n}.json", EvalReport) for n in names}
    histories = {n: read_history(train_dir / "history" / f"{n}.csv") for n in names}
    comparison = build_comparison(train_reports, eval_reports, histories, config.compare,
                                  rounds=_rounds(config, train_reports, histories, repeats_dir))
    figures = plot_figures(comparison, histories, out / "figures")
    atomic.write_json(out / "compare.json", to_json(comparison))
    atomic.write_json(out / "metrics.json", {  # a run that never reached the target has no time to it
        name: {key: round(value, 4) for key, value in headline_metrics(row).items()}
        for name, row in comparison.runs.items()
    })
    curves = [{"run": name, **row, "epoch": int(row["epoch"]), "training_seconds": round(seconds, 4)}
              for name in names for row, seconds in zip(histories[name], training_seconds(histories[name]), strict=True)]
    atomic.write_csv(out / "curves.csv", curves, ("run", "epoch", *CURVE_COLUMNS, "training_seconds"))
    atomic.write_text(out / "compare.md", render_markdown(comparison))
    atomic.write_text(out / "compare.html", render_html(comparison, out))
    _track_comparison(config, comparison, [out / f"compare.{kind}" for kind in ("json", "md", "html")], figures)
    log.info("%s", comparison.verdict)
    return comparison


def _rounds(config: Config, first: dict[str, TrainReport], histories: dict[str, list[dict[str, float]]],
            repeats_dir: Path) -> dict[str, list[Round]] | None:
    """Every round of every run, round 1 (the train stages') first; None without repeats."""
    if config.compare.repeats == 1:
        return None
    rounds: dict[str, list[Round]] = {name: [(report, histories[name])] for name, report in first.items()}
    for repeat in planned(config.run_names, config.compare.repeats):
        report = read_report(repeats_dir / f"{repeat.label}.json", TrainReport)
        rounds[repeat.name].append((report, read_history(repeats_dir / "history" / f"{repeat.label}.csv")))
    return rounds


def _track_comparison(config: Config, comparison: Comparison, files: list[Path], figures: list[Path]) -> None:
    """Attach the comparison to the execution's parent run: report files, figures, a few headline numbers.

    Only three metrics, so that MLflow's chart view shows the training runs'
    curves, not a chart per compared run and number; each run's own numbers
    are on its run. With registered models, ``@champion`` moves to the best.
    """
    experiment_id = experiment.configure(config.mlflow)
    rows = comparison.rows
    ranked = sorted(rows, key=lambda row: (row.test_accuracy, row.report.steady_samples_per_second), reverse=True)
    links = [
        f"- [{row.report.run_label}](#/experiments/{experiment_id}/runs/{row.report.mlflow_run_id}): "
        f"{row.speedup:.2f}x, test accuracy {row.test_accuracy:.4f}"
        for row in rows if row.report.mlflow_run_id
    ]
    execution = runs.execution_id(config)
    with runs.reopen(runs.execution_run(config)):
        runs.set_tags({
            "compared": ",".join(comparison.runs), "cpu_count": comparison.cpu_count,
            "fastest": max(rows, key=lambda row: row.report.steady_samples_per_second).name, "best": ranked[0].name,
            "mlflow.note.content": "\n".join([comparison.verdict, "", "Runs compared:", *links]),
        })
        fastest = max(rows, key=lambda row: row.speedup)
        interval = fastest.interval("speedup")
        rerun.log_missing_metrics({
            "best_speedup": fastest.speedup,
            **({"best_speedup_low": interval.low, "best_speedup_high": interval.high} if interval else {}),
            "best_test_accuracy": ranked[0].test_accuracy,
            "runs_compared": len(rows),
        })
        runs.log_artifacts(files)
        runs.log_artifacts(figures, "figures")
    for row in rows:  # what the comparison measured of each run (its time to accuracy), beside its curves
        if row.report.mlflow_run_id:
            rerun.log_missing_metrics(mlflow_metrics(row, nested=False), run_id=row.report.mlflow_run_id)
    if config.mlflow.register_models:
        models.set_champion(config.mlflow.registered_model,
                            [row.report.mlflow_run_id for row in ranked if row.report.mlflow_run_id])
    log.info("MLflow: this execution's training runs are at <UI>/%s (make ui prints the full address)",
             addresses.runs_page(experiment_id, execution))
