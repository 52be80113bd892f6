"""The ``tfdist`` command: the operator tools around the pipeline, one subcommand each.

DVC runs the pipeline (``dvc repro``); ``tfdist`` serves and moves what it
made: the MLflow UI (``ui``), TensorBoard on the runs' curves and traces
(``tensorboard``), a team's tracking server (``server``), a local S3 store
(``s3``), the DVC remote (``push``, ``pull``, ``status``), and the trimmed
views of experiments and plots (``experiments``, ``plots``).
"""

from __future__ import annotations

import click

from tfdist_cli import experiments, plots, remote, s3, server, tensorboard, ui


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Operator tools for the tfdist pipeline (run the pipeline itself with `dvc repro`)."""


cli.add_command(ui.ui)
cli.add_command(server.server)
cli.add_command(s3.s3)
cli.add_command(remote.push)
cli.add_command(remote.pull)
cli.add_command(remote.status)
cli.add_command(experiments.experiments)
cli.add_command(plots.plots)
cli.add_command(tensorboard.tensorboard)
