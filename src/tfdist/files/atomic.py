"""Outputs that appear whole or not at all.

DVC caches whatever a stage leaves behind, so a stage killed halfway must not
leave a truncated file in place: everything is written under a temporary name
in the same folder and renamed into place, which is atomic on POSIX. A killed
stage's temporaries are swept by the next (:func:`sweep_staging`), and the
``outputs.*`` crash points (:mod:`tfdist.crash_points`) let tests prove all of
it by killing stages for real at every step.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import io
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tfdist.files.disk import write_error
from tfdist.files.locks import try_flock

log = logging.getLogger(__name__)


class Outputs:
    """Several outputs replaced together: each staged beside its target, all renamed once every one is whole.

    A stage that writes a model and its reports must not leave a new model
    beside old reports because the reports' disk filled: until :meth:`commit`,
    every target is as it was. Each staging folder is locked (``flock`` on the
    folder) while its process lives, so a later stage tells a killed run's
    debris from a living run's work (:func:`sweep_staging`).

    Args:
        moments: told ``outputs.staged``, ``outputs.commit`` and ``outputs.committed`` as the commit passes them
            (a stage's own outputs: its crash points, :mod:`tfdist.crash_points`).
    """

    def __init__(self, moments: Callable[[str], None] | None = None) -> None:
        self._staged: list[tuple[Path, Path, Path, int | None]] = []  # (target, its temporary folder, staged, size)
        self._locks: list[int] = []
        self.moments = moments or (lambda name: None)

    def stage(self, target: Path | str, size: int | None = None) -> Path:
        """A temporary path beside ``target`` to write it at (``size``: the bytes it will take, if known)."""
        target = Path(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=_staging_prefix(target), suffix=".tmp", dir=target.parent))
        except OSError as err:
            raise write_error(err, target, None, size) from None
        self._locks.append(_lock_folder(tmp))
        self._staged.append((target, tmp, tmp / target.name, size))
        return tmp / target.name

    def expect(self, staged: Path, size: int) -> None:
        """Say how many bytes ``staged`` (a path :meth:`stage` gave) will take, once known: a full disk's error names it."""
        self._staged = [(t, tmp, s, size if s == staged else n) for t, tmp, s, n in self._staged]

    def commit(self) -> None:
        """Rename every staged output onto its target (a folder replaces a folder)."""
        for target, _, staged, _ in self._staged:
            if not staged.exists():
                raise FileNotFoundError(f"nothing was written for {target}")
        self.moments("outputs.staged")
        renames = 0
        for target, tmp, staged, _ in self._staged:
            moves = [(target, tmp / (target.name + ".old"))] if staged.is_dir() and target.is_dir() else []
            for source, destination in [*moves, (staged, target)]:
                os.replace(source, destination)
                renames += 1
                if renames == 1:  # the first output in place, or a folder's old one moved away: the rest not yet
                    self.moments("outputs.commit")
        self.moments("outputs.committed")

    def discard(self) -> None:
        """Remove every temporary, staged or replaced, and release their locks."""
        for _, tmp, _, _ in self._staged:
            shutil.rmtree(tmp, ignore_errors=True)
        for fd in self._locks:
            os.close(fd)
        self._staged.clear()
        self._locks.clear()

    def failed(self, err: OSError) -> Exception:
        """``err`` as the error a user reads, when it is a full disk or a folder that cannot be written."""
        written = err.filename2 or err.filename  # a copy's error names its source first, then where it wrote
        for target, _, staged, size in reversed(self._staged):
            if written is None or str(written).startswith(str(staged.parent)):
                return write_error(err, target, staged, size)
        return write_error(err, Path(written), None, None) if written else err


@contextlib.contextmanager
def atomic_outputs(moments: Callable[[str], None] | None = None) -> Iterator[Outputs]:
    """Stage outputs with :meth:`Outputs.stage` in the block; all replace their targets when it ends without error.

    ``moments``: told the commit's moments (see :class:`Outputs`).
    """
    outputs = Outputs(moments)
    try:
        yield outputs
        outputs.commit()
    except OSError as err:
        raise outputs.failed(err) from None
    finally:
        outputs.discard()


@contextlib.contextmanager
def atomic_path(target: Path | str, size: int | None = None) -> Iterator[Path]:
    """Yield a temporary sibling path; on success rename it onto ``target``.

    Works for files and folders: whatever the caller creates at the yielded
    path replaces ``target``. On error the temporary is removed and ``target``
    is left as it was; a full disk or a folder that cannot be written is
    raised as the one line a user reads (``size``: the bytes it would take).
    """
    with atomic_outputs() as outputs:
        yield outputs.stage(target, size)


def _staging_prefix(target: Path) -> str:
    return f".{target.name}."


def _lock_folder(folder: Path) -> int:
    """An exclusive ``flock`` on a folder just made (nobody else can hold it); its descriptor, to close when done."""
    fd = try_flock(folder)
    assert fd is not None, f"{folder} was made by this process"
    return fd


def sweep_staging(*targets: Path | str) -> list[Path]:
    """Remove the staging folders of ``targets`` that no living process holds: what a killed stage left.

    A staging folder is locked by the process writing it (:class:`Outputs`),
    and the kernel releases the lock when that process dies however it dies,
    so a folder whose lock can be taken is debris, whatever its age; one a
    running stage holds is left alone. Says so in one line; returns the folders removed.
    """
    removed = []
    for target in map(Path, targets):
        if not target.parent.is_dir():
            continue
        for folder in sorted(target.parent.glob(f"{glob.escape(_staging_prefix(target))}*.tmp")):
            if folder.is_dir() and _debris(folder):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    if removed:
        log.info("removed %d staging folder(s) a killed stage left: %s", len(removed), ", ".join(map(str, removed)))
    return removed


def _debris(folder: Path) -> bool:
    """Whether no living process holds ``folder``'s staging lock (taking it for the moment of the look)."""
    try:
        fd = try_flock(folder)
    except OSError:
        return False
    if fd is None:
        return False
    os.close(fd)
    return True


def write_text(target: Path | str, text: str, *, outputs: Outputs | None = None) -> None:
    """Write ``text`` to ``target`` atomically, or, with ``outputs``, staged with the others there."""
    data = text.encode()
    if outputs is not None:
        outputs.stage(target, size=len(data)).write_bytes(data)
        return
    with atomic_outputs() as alone:
        alone.stage(target, size=len(data)).write_bytes(data)


def write_json(target: Path | str, data: Any, *, outputs: Outputs | None = None) -> None:
    """Write ``data`` as indented JSON atomically (key order kept: it is meaningful in reports)."""
    write_text(target, json.dumps(data, indent=2) + "\n", outputs=outputs)


def write_csv(target: Path | str, rows: list[dict[str, Any]], columns: tuple[str, ...] | list[str], *,
              outputs: Outputs | None = None) -> None:
    """Write ``rows`` as CSV with a header of ``columns`` atomically (other keys are left out)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(target, buffer.getvalue(), outputs=outputs)
