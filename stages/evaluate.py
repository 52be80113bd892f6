"""Stage evaluate: every trained model on the test split, plus each one's confusion matrix."""

from __future__ import annotations

from pathlib import Path

import click

import stages  # noqa: F401  (first: it filters TensorFlow's native start-up chatter before TensorFlow loads)
from tfdist.config.params import check_run_name, load_config
from tfdist.evaluate.stage import evaluate
from tfdist.files import atomic, disk
from tfdist.records.reports import write_report
from tfdist_cli.contract import config_options, run_stage, stage_errors, stage_outputs, stage_started


@click.command()
@config_options
@click.option("--name", "names", multiple=True,
              help="A run to evaluate (models/NAME); repeatable. Default: normal and every distributed.strategies entry.")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default="data/prepared", show_default=True,
              help="Prepared data folder (from the preprocess stage).")
@click.option("--models", "models_dir", type=click.Path(path_type=Path), default="models", show_default=True,
              help="Folder holding NAME/ for each run.")
@click.option("--train-reports", type=click.Path(path_type=Path), default="reports/train", show_default=True,
              help="Folder holding NAME.json (gives the MLflow run to log test metrics on).")
@click.option("--reports", "reports_dir", type=click.Path(path_type=Path), default="reports/eval", show_default=True,
              help="Folder for NAME.json and confusion/NAME.csv.")
def main(params_path: Path, overrides: tuple[str, ...], names: tuple[str, ...], data_dir: Path, models_dir: Path,
         train_reports: Path, reports_dir: Path) -> None:
    """Test loss, accuracy and per-class precision/recall of each model; log them to its MLflow run."""
    with stage_errors():
        config = load_config(params_path, overrides)
        chosen = [check_run_name(name) for name in names or config.run_names]
        disk.check_writable(reports_dir)
        chosen = list(dict.fromkeys(chosen))
        stage_started(*(path for name in chosen
                        for path in (reports_dir / f"{name}.json", reports_dir / "confusion" / f"{name}.csv")))
        results = evaluate(config, chosen, prepared_dir=data_dir, models_dir=models_dir,
                           train_reports=train_reports)
        # once every model is evaluated (its metrics logged to its run), all or none: no half-done set
        with stage_outputs(summary=True) as outputs:
            for result in results:
                atomic.write_csv(reports_dir / "confusion" / f"{result.report.name}.csv", result.confusion_rows(),
                                 ("actual", "predicted"), outputs=outputs)
                write_report(reports_dir / f"{result.report.name}.json", result.report, outputs=outputs)


if __name__ == "__main__":
    run_stage(main)
