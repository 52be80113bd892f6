"""``tfdist plots``: every run's curves, confusion matrices and compare figures drawn by DVC, offline.

Runs ``dvc plots show`` (or ``dvc plots diff REV...``) on the project's
offline page, ``.dvc/config``'s ``plots.html_template``. Where that page is
missing (a clone installed with plain pip, a ``git clean``), says in one line
how to build it instead of DVC's "HTML template has to contain '{plot_divs}'".
"""

from __future__ import annotations

import configparser
from pathlib import Path

import click

from tfdist import native_logs
from tfdist.errors import InputError
from tfdist_cli.contract import stage_errors
from tfdist_cli.programs import required_program


def offline_page(root: Path) -> Path:
    """The plots template ``.dvc/config`` names (relative to ``.dvc/``), checked to exist.

    Raises:
        InputError: it is not there, naming it and the command that builds it.
    """
    config = configparser.ConfigParser()
    config.read(root / ".dvc" / "config")
    named = config.get("plots", "html_template", fallback=None)
    if named is None:
        raise InputError(f"{root / '.dvc' / 'config'} names no plots.html_template; set it to ../vega/offline.html")
    page = (root / ".dvc" / named).resolve()
    if not page.is_file():
        raise InputError(f"{page} (the offline page dvc plots draws on) is missing: build it with "
                         "`python vega/build_template.py` (make install does)")
    return page


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("dvc_args", nargs=-1, type=click.UNPROCESSED)
def plots(dvc_args: tuple[str, ...]) -> None:
    """`dvc plots show`, or `dvc plots diff` with DVC_ARGS starting `diff` (e.g. diff main); other args go to dvc."""
    with stage_errors():
        offline_page(Path.cwd())
        dvc = required_program("dvc", "activate the project's environment (. .venv/bin/activate)")
        args = list(dvc_args) if dvc_args and dvc_args[0] in ("show", "diff") else ["show", *dvc_args]
        native_logs.exec_program(dvc, [dvc, "plots", *args])

