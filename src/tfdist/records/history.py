"""A run's per-epoch history: the CSV the train stage writes beside its report, and reads back to resume."""

from __future__ import annotations

import csv
from pathlib import Path

from tfdist.errors import InputError
from tfdist.files import atomic

EPOCH_COLUMNS = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "epoch_seconds", "samples_per_second")

#: Per-epoch columns only some runs have: the custom loop's gradient statistics, the input's share of the steps
#: where they are timed (:class:`tfdist.train.callbacks.InputWait`).
CUSTOM_LOOP_COLUMNS = ("gradient_norm", "gradient_norm_max", "nonfinite_steps")
OPTIONAL_COLUMNS = (*CUSTOM_LOOP_COLUMNS, "input_share")


def history_columns(history: list[dict[str, float]]) -> tuple[str, ...]:
    """The columns of ``history`` rows, in a stable order."""
    present = set(history[0]) if history else set()
    return EPOCH_COLUMNS + tuple(column for column in OPTIONAL_COLUMNS if column in present)


def write_history(path: Path | str, history: list[dict[str, float]], *, outputs: atomic.Outputs | None = None) -> None:
    """Write a per-epoch history as CSV atomically, its columns in :func:`history_columns` order."""
    atomic.write_csv(path, history, history_columns(history), outputs=outputs)


def read_history(path: Path) -> list[dict[str, float]]:
    """Read a per-epoch history CSV written by the train stage."""
    try:
        with open(path, newline="") as handle:
            return [{key: float(value) for key, value in row.items()} for row in csv.DictReader(handle)]
    except FileNotFoundError:
        raise InputError(f"{path} not found; run the train stage (dvc repro)") from None
