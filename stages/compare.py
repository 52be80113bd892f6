"""Stage compare: every run side by side, with a verdict and figures."""

from __future__ import annotations

from pathlib import Path

import click

import stages  # noqa: F401  (first: it filters TensorFlow's native start-up chatter before TensorFlow loads)
from tfdist.compare.stage import compare
from tfdist.config.params import load_config
from tfdist.files.disk import check_writable
from tfdist_cli.contract import config_options, run_stage, stage_errors, stage_outputs, stage_started


@click.command()
@config_options
@click.option("--train-reports", type=click.Path(path_type=Path), default="reports/train", show_default=True,
              help="Folder of train reports and history/.")
@click.option("--eval-reports", type=click.Path(path_type=Path), default="reports/eval", show_default=True,
              help="Folder of eval reports.")
@click.option("--repeats", "repeats_dir", type=click.Path(path_type=Path), default="repeats/reports", show_default=True,
              help="Folder of the repeat stage's reports (rounds 2 and on, with compare.repeats above 1).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default="reports/compare", show_default=True,
              help="Folder for compare.json/.md/.html, metrics.json, curves.csv and figures/.")
def main(params_path: Path, overrides: tuple[str, ...], train_reports: Path, eval_reports: Path, repeats_dir: Path,
         out_dir: Path) -> None:
    """Compare normal training with each of distributed.strategies: time, throughput, accuracy."""
    with stage_errors():
        config = load_config(params_path, overrides)
        check_writable(out_dir)
        stage_started(out_dir)
        with stage_outputs(summary=True) as outputs:  # the report, its figures and its MLflow run, all or none
            comparison = compare(config, train_dir=train_reports, eval_dir=eval_reports, repeats_dir=repeats_dir,
                                 out=outputs.stage(out_dir))
        click.echo(comparison.verdict)
        # what more machines would give, and the network it assumed (compare.network_*)
        click.echo(f"With more machines: {comparison.advice.scale}")


if __name__ == "__main__":
    run_stage(main)
