"""Stage evaluate: one trained model on the test split, plus its confusion matrix."""

from __future__ import annotations

from pathlib import Path

import click

from stages._cli import config_options, stage_errors
from tfdist import atomic
from tfdist.config import check_run_name, load_config
from tfdist.evaluate.stage import evaluate
from tfdist.reports import write_report


@click.command()
@config_options
@click.option("--name", required=True, help="The run to evaluate (models/NAME).")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default="data/prepared", show_default=True,
              help="Prepared data folder (from the preprocess stage).")
@click.option("--models", "models_dir", type=click.Path(path_type=Path), default="models", show_default=True,
              help="Folder holding NAME/.")
@click.option("--train-reports", type=click.Path(path_type=Path), default="reports/train", show_default=True,
              help="Folder holding NAME.json (gives the MLflow run to log test metrics on).")
@click.option("--reports", "reports_dir", type=click.Path(path_type=Path), default="reports/eval", show_default=True,
              help="Folder for NAME.json and confusion/NAME.csv.")
def main(params_path: Path, overrides: tuple[str, ...], name: str, data_dir: Path, models_dir: Path,
         train_reports: Path, reports_dir: Path) -> None:
    """Test loss, accuracy and per-class precision/recall of model NAME; log them to its MLflow run."""
    with stage_errors():
        name = check_run_name(name)
        config = load_config(params_path, overrides)
        report, actual, predicted = evaluate(config, name, data_dir, models_dir / name, train_reports / f"{name}.json")
        rows = "".join(f"{a},{p}\n" for a, p in zip(actual, predicted, strict=True))
        atomic.write_text(reports_dir / "confusion" / f"{name}.csv", "actual,predicted\n" + rows)
        write_report(reports_dir / f"{name}.json", report)


if __name__ == "__main__":
    main()
