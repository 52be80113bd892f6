"""Stage preprocess: MNIST -> normalised, split arrays and a data summary."""

from __future__ import annotations

from pathlib import Path

import click

import stages  # noqa: F401  (first: it filters TensorFlow's native start-up chatter before TensorFlow loads)
from tfdist.config.params import load_config
from tfdist.data.stage import preprocess
from tfdist.files import atomic, disk
from tfdist_cli.contract import config_options, run_stage, stage_errors, stage_outputs, stage_started


@click.command()
@config_options
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default="data/prepared", show_default=True,
              help="Folder for train.npz, val.npz and test.npz.")
@click.option("--report", type=click.Path(path_type=Path), default="reports/data.json", show_default=True,
              help="Data summary: source, counts per split and class, sha256.")
def main(params_path: Path, overrides: tuple[str, ...], out_dir: Path, report: Path) -> None:
    """Load MNIST from data.source, normalise to [0, 1], split train/val/test by label."""
    with stage_errors():
        config = load_config(params_path, overrides)
        disk.check_writable(out_dir, report)
        stage_started(out_dir, report)
        with stage_outputs() as outputs:  # the data and its summary, all or none
            atomic.write_json(report, preprocess(config, out_dir, outputs=outputs), outputs=outputs)


if __name__ == "__main__":
    run_stage(main)
