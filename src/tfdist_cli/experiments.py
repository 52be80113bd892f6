"""``tfdist experiments``: DVC experiments, each run's headline numbers in a table a terminal shows.

By default, one block per experiment (the workspace, its baseline commit, and
every experiment ``dvc exp run`` made from it): a line naming the knobs set
otherwise than in the workspace, then a row per run with its headline metrics
(reports/compare/metrics.json), no wider than ``--width``. ``--full``, or any
argument for dvc (``--csv``, ``--json``, ``-A``), runs ``dvc exp show`` itself
without the dependency hashes and without every knob whose role
(``tfdist.config.ROLES``) is not ``result``: the list is derived from the
knobs themselves, as the backup key is, so the two cannot disagree.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import click

from tfdist import native_logs
from tfdist.config.params import dotted_keys, knob_roles
from tfdist.errors import InputError, RunError
from tfdist.records.measures import interval_text
from tfdist_cli.contract import stage_errors
from tfdist_cli.programs import required_program

#: Columns of ``dvc exp show`` that are not knobs: dependency hashes (``path/to/file``) and the date.
_NOT_KNOBS = (r".*/.*", "Created")
#: The metrics file the compare stage writes, and the columns shown of it (metric, title, format).
METRICS_FILE = "reports/compare/metrics.json"
COLUMNS = (("samples_per_second", "samples/s", "{:,.0f}"), ("speedup", "speed-up", "{:.2f}x"),
           ("test_accuracy", "test acc.", "{:.4f}"), ("seconds_to_target", "s to target", "{:.2f}"),
           ("time_to_accuracy_speedup", "speed-up to target", "{:.2f}x"))
#: Seconds ``dvc exp show`` gets to list the experiments.
DVC_TIMEOUT = 120


def hidden_columns() -> str:
    """The ``--drop`` regex: whole column names to hide."""
    return "|".join([*_NOT_KNOBS, *(re.escape(key) for key, role in knob_roles().items() if role != "result")])


def experiments_of(shown: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(name, data)`` for every row of ``dvc exp show --json``: the workspace, each baseline, their experiments."""
    for entry in shown:
        if entry.get("data"):
            yield entry.get("name") or _short(entry["rev"]), entry["data"]
        for experiment in entry.get("experiments") or []:
            for rev in experiment.get("revs") or []:
                if rev.get("data"):
                    yield rev.get("name") or experiment.get("name") or _short(rev["rev"]), rev["data"]


def _short(rev: str) -> str:
    """A commit as its first 7 hex digits; ``workspace`` as it is."""
    return rev[:7] if re.fullmatch(r"[0-9a-f]{40}", rev) else rev


def _params(data: dict[str, Any]) -> dict[str, Any]:
    return dotted_keys(((data.get("params") or {}).get("params.yaml") or {}).get("data") or {})


def compact_view(shown: list[dict[str, Any]], width: int = 120) -> str:
    """The experiments as blocks of runs by headline metrics, each line at most ``width`` characters."""
    result_knobs = {key for key, role in knob_roles().items() if role == "result"}
    rows = list(experiments_of(shown))
    if not rows:
        return "No experiments yet: run the pipeline (dvc repro) or an experiment (dvc exp run -S train.epochs=5)."
    baseline = _params(rows[0][1])
    out: list[str] = []
    for name, data in rows:
        params = _params(data)
        changed = [f"{key}={params[key]}" for key in sorted(result_knobs & params.keys())
                   if params[key] != baseline.get(key)]
        out.append(_clip(f"{name}: " + (", ".join(changed) if changed else "the workspace's params"), width))
        metrics = ((data.get("metrics") or {}).get(METRICS_FILE) or {}).get("data") or {}
        if not metrics:
            out += ["  (no comparison: its compare stage has not run)", ""]
            continue
        table = [["run", *(title for _, title, _ in COLUMNS)]]
        table += [[run, *(_cell(values, key, fmt) for key, _, fmt in COLUMNS)] for run, values in metrics.items()]
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        out += [_clip("  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                                        for i, (cell, w) in enumerate(zip(row, widths, strict=True))), width)
                for row in table]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _cell(values: dict[str, Any], key: str, fmt: str) -> str:
    """A metric's cell, with its interval where metrics.json gives one (``0.51x (0.47-0.55)``)."""
    value = values.get(key)
    if value is None:
        return "–"
    low, high = values.get(f"{key}_low"), values.get(f"{key}_high")
    return fmt.format(value) + ("" if low is None or high is None else f" {interval_text(low, high)}")


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[:width - 1] + "…"


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--width", default=120, show_default=True, type=click.IntRange(40, 1000), help="Widest line printed.")
@click.option("--full", is_flag=True, help="Run `dvc exp show` itself: every result knob and metric as a column.")
@click.option("--precision", default=4, show_default=True, type=click.IntRange(1, 12),
              help="Significant digits (with --full or DVC_ARGS).")
@click.argument("dvc_args", nargs=-1, type=click.UNPROCESSED)
def experiments(width: int, full: bool, precision: int, dvc_args: tuple[str, ...]) -> None:
    """Each experiment's runs by their headline numbers; --full or DVC_ARGS (e.g. --csv, -A) run `dvc exp show`."""
    with stage_errors():
        dvc = required_program("dvc", "activate the project's environment (. .venv/bin/activate)")
        if full or dvc_args:
            native_logs.exec_program(dvc, [dvc, "exp", "show", "--drop", hidden_columns(), "--precision", str(precision),
                                           *dvc_args])
        try:
            shown = subprocess.run([dvc, "exp", "show", "--json"], capture_output=True, text=True, timeout=DVC_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise RunError(f"dvc exp show did not answer in {DVC_TIMEOUT} s") from None
        if shown.returncode != 0:
            raise InputError(f"dvc exp show failed: {shown.stderr.strip().splitlines()[-1] if shown.stderr.strip() else ''}")
        click.echo(compact_view(json.loads(shown.stdout), width), nl=False)
