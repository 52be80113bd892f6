"""Stage train: one model under one tf.distribute strategy, tracked in MLflow."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

import stages  # noqa: F401  (first: it filters TensorFlow's native start-up chatter before TensorFlow loads)
from tfdist.config.params import check_run_name, load_config
from tfdist.distribute.registry import STRATEGY_NAMES
from tfdist.files.disk import check_writable
from tfdist.records.run_names import RunPaths
from tfdist.runtime.allocator import run_under_allocator
from tfdist.train.stage import train
from tfdist_cli.contract import config_options, run_stage, stage_errors, stage_started


@click.command()
@config_options
@click.option("--strategy", default="default", show_default=True, metavar="NAME",
              help=f"tf.distribute strategy: {', '.join(STRATEGY_NAMES)}; 'default' is normal, undistributed training.")
@click.option("--name", required=True,
              help="Run name (letters, digits, _ . -): models/NAME, reports/train/NAME.json, the MLflow run's model_name.")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default="data/prepared", show_default=True,
              help="Prepared data folder (from the preprocess stage).")
@click.option("--models", "models_dir", type=click.Path(path_type=Path), default="models", show_default=True,
              help="Folder that receives the model as NAME/.")
@click.option("--reports", "reports_dir", type=click.Path(path_type=Path), default="reports/train", show_default=True,
              help="Folder for NAME.json and history/NAME.csv.")
@click.option("--backups", "backups_dir", type=click.Path(path_type=Path), default=".tfdist/backups", show_default=True,
              help="Where the run backs up every epoch, to resume after a crash (shared storage on a cluster).")
def main(params_path: Path, overrides: tuple[str, ...], strategy: str, name: str,
         data_dir: Path, models_dir: Path, reports_dir: Path, backups_dir: Path) -> None:
    """Train the model of model.kind with STRATEGY and write the model, a report and per-epoch history.

    multi_worker_mirrored and parameter_server run as the task TF_CONFIG names
    when it is set (cluster mode), else start distributed.workers workers (and
    distributed.ps parameter servers) as local processes on 127.0.0.1.
    """
    with stage_errors():
        name = check_run_name(name)
        config = load_config(params_path, overrides)
        if __name__ == "__main__":  # a stage process (not a test calling main): it may start itself again, first
            run_under_allocator(config.runtime.allocator, config.model.kind)
        launch = run_command(params_path, overrides, strategy=strategy, name=name, data=data_dir, models=models_dir,
                             reports=reports_dir, backups=backups_dir)
        check_writable(models_dir / name, reports_dir, backups_dir)
        stage_started(models_dir / name, reports_dir / f"{name}.json", reports_dir / "history" / f"{name}.csv")
        train(config, strategy_name=strategy, name=name, launch=launch,
              paths=RunPaths(data_dir, models_dir / name, backups_dir, reports=reports_dir))


def run_command(params_path: Path, overrides: Sequence[str] = (), *, strategy: str, name: str, data: Path,
                models: Path, reports: Path, backups: Path) -> list[str]:
    """This stage as the command that trains run ``name``: a local cluster's tasks, the repeats, tests, benchmarks."""
    return [sys.executable, "-m", "stages.train", "--params", str(params_path),
            *(arg for item in overrides for arg in ("--set", item)), "--strategy", strategy, "--name", name,
            "--data", str(data), "--models", str(models), "--reports", str(reports), "--backups", str(backups)]


if __name__ == "__main__":
    run_stage(main)
