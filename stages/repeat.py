"""Stage repeat: rounds 2 to compare.repeats of every training, interleaved (normal, s1, s2, ..., normal, s1, ...)."""

from __future__ import annotations

import functools
from pathlib import Path

import click

import stages  # noqa: F401  (first: it filters TensorFlow's native start-up chatter before TensorFlow loads)
from stages import train as train_stage  # each repeat runs it, as a child process
from tfdist.config.params import load_config
from tfdist.files.disk import check_writable
from tfdist.train.repeats import MANIFEST, RepeatPaths, run_repeats
from tfdist_cli.contract import config_options, run_stage, stage_errors, stage_started


@click.command()
@config_options
@click.option("--first", "first_reports", type=click.Path(path_type=Path), default="reports/train", show_default=True,
              help="Round 1's reports (the train stages'): a repeat is kept while its round-1 run is unchanged.")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default="data/prepared", show_default=True,
              help="Prepared data folder (from the preprocess stage).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default="repeats", show_default=True,
              help=f"Folder for the repeats: models/NAME.rK/, reports/NAME.rK.json, reports/history/NAME.rK.csv, "
                   f"and {MANIFEST}.")
@click.option("--backups", "backups_dir", type=click.Path(path_type=Path), default=".tfdist/backups", show_default=True,
              help="Where each repeat backs up every epoch, to resume after a crash.")
def main(params_path: Path, overrides: tuple[str, ...], first_reports: Path, data_dir: Path, out_dir: Path,
         backups_dir: Path) -> None:
    """Train every run of the comparison again, compare.repeats times in all, round after round.

    Each repeat is the train stage run as NAME.rK (its own MLflow run in the
    execution); one that finished beside the same round-1 run is kept, so a
    rerun trains only what is missing. With compare.repeats: 1 it trains nothing.
    """
    with stage_errors():
        config = load_config(params_path, overrides)
        train_command = functools.partial(train_stage.run_command, params_path, overrides)
        check_writable(out_dir, backups_dir)
        stage_started()
        run_repeats(config, RepeatPaths(first_reports, data_dir, out_dir, backups_dir), train_command)


if __name__ == "__main__":
    run_stage(main)
