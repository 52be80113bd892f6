"""``tfdist experiments``: DVC experiments with the params and metrics that decide a result.

Runs ``dvc exp show`` without the dependency hashes and without every knob
whose role (``tfdist.config.ROLES``) is not ``result``: where runs are tracked,
timeouts, restarts. The list is derived from the knobs themselves, as the
backup key is, so the two cannot disagree.
"""

from __future__ import annotations

import re
import shutil

import click

from tfdist import native_logs
from tfdist.config import knob_roles
from tfdist.errors import InputError
from tfdist_cli.contract import stage_errors

#: Columns of ``dvc exp show`` that are not knobs: dependency hashes (``path/to/file``) and the date.
_NOT_KNOBS = (r".*/.*", "Created")


def hidden_columns() -> str:
    """The ``--drop`` regex: whole column names to hide."""
    return "|".join([*_NOT_KNOBS, *(re.escape(key) for key, role in knob_roles().items() if role != "result")])


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--precision", default=4, show_default=True, type=click.IntRange(1, 12), help="Significant digits.")
@click.argument("dvc_args", nargs=-1, type=click.UNPROCESSED)
def experiments(precision: int, dvc_args: tuple[str, ...]) -> None:
    """Show `dvc exp show` trimmed to what decides a result; DVC_ARGS go to dvc (e.g. --json, -A)."""
    with stage_errors():
        dvc = shutil.which("dvc")
        if dvc is None:
            raise InputError("dvc is not on PATH; activate the project's environment (. .venv/bin/activate)")
        native_logs.exec_program(dvc, [dvc, "exp", "show", "--drop", hidden_columns(), "--precision", str(precision), *dvc_args])

