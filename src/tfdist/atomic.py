"""Outputs that appear whole or not at all.

DVC caches whatever a stage leaves behind, so a stage killed halfway must not
leave a truncated file in place: everything is written under a temporary name
in the same folder and renamed into place, which is atomic on POSIX.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(target: Path | str) -> Iterator[Path]:
    """Yield a temporary sibling path; on success rename it onto ``target``.

    Works for files and folders: whatever the caller creates at the yielded
    path replaces ``target``. On error the temporary is removed and ``target``
    is left as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    staged = tmp / target.name
    try:
        yield staged
        if not staged.exists():
            raise FileNotFoundError(f"nothing was written for {target}")
        if staged.is_dir() and target.is_dir():
            old = tmp / (target.name + ".old")
            os.replace(target, old)
        os.replace(staged, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(target: Path | str, text: str) -> None:
    """Write ``text`` to ``target`` atomically."""
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def write_json(target: Path | str, data: Any) -> None:
    """Write ``data`` as indented JSON atomically (key order kept: it is meaningful in reports)."""
    write_text(target, json.dumps(data, indent=2) + "\n")


def write_csv(target: Path | str, rows: list[dict[str, Any]], columns: tuple[str, ...] | list[str]) -> None:
    """Write ``rows`` as CSV with a header of ``columns`` atomically (other keys are left out)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(target, buffer.getvalue())
