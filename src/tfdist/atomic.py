"""Outputs that appear whole or not at all.

DVC caches whatever a stage leaves behind, so a stage killed halfway must not
leave a truncated file in place: everything is written under a temporary name
in the same folder and renamed into place, which is atomic on POSIX.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import filelock

from tfdist.errors import DiskFull, InputError

#: What a full disk says (a quota counts as one), and a folder that cannot be written.
_FULL = (errno.ENOSPC, errno.EDQUOT)
_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


class Outputs:
    """Several outputs replaced together: each staged beside its target, all renamed once every one is whole.

    A stage that writes a model and its reports must not leave a new model
    beside old reports because the reports' disk filled: until :meth:`commit`,
    every target is as it was.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path, Path, int | None]] = []  # (target, its temporary folder, staged, size)

    def stage(self, target: Path | str, size: int | None = None) -> Path:
        """A temporary path beside ``target`` to write it at (``size``: the bytes it will take, if known)."""
        target = Path(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
        except OSError as err:
            raise _write_error(err, target, None, size) from None
        self._staged.append((target, tmp, tmp / target.name, size))
        return tmp / target.name

    def commit(self) -> None:
        """Rename every staged output onto its target (a folder replaces a folder)."""
        for target, _, staged, _ in self._staged:
            if not staged.exists():
                raise FileNotFoundError(f"nothing was written for {target}")
        for target, tmp, staged, _ in self._staged:
            if staged.is_dir() and target.is_dir():
                os.replace(target, tmp / (target.name + ".old"))
            os.replace(staged, target)

    def discard(self) -> None:
        """Remove every temporary, staged or replaced."""
        for _, tmp, _, _ in self._staged:
            shutil.rmtree(tmp, ignore_errors=True)
        self._staged.clear()

    def failed(self, err: OSError) -> Exception:
        """``err`` as the error a user reads, when it is a full disk or a folder that cannot be written."""
        written = err.filename2 or err.filename  # a copy's error names its source first, then where it wrote
        for target, _, staged, size in reversed(self._staged):
            if written is None or str(written).startswith(str(staged.parent)):
                return _write_error(err, target, staged, size)
        return _write_error(err, Path(written), None, None) if written else err


@contextlib.contextmanager
def atomic_outputs() -> Iterator[Outputs]:
    """Stage outputs with :meth:`Outputs.stage` in the block; all replace their targets when it ends without error."""
    outputs = Outputs()
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


@contextlib.contextmanager
def exclusive_lock(path: Path | str, timeout: float | None = None) -> Iterator[None]:
    """An exclusive lock on the file ``path`` for the block, one process at a time machine-wide.

    filelock's ``flock``: the kernel releases it when its holder dies, so a
    killed stage never leaves a lock that blocks the next one.

    Raises:
        TimeoutError: another process held it for ``timeout`` seconds (None: wait as long as it takes).
        OSError: the lock file cannot be created (its folder is missing or read-only).
    """
    lock = filelock.FileLock(path, timeout=-1 if timeout is None else timeout)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise TimeoutError(f"another process has held {path} for {timeout:.0f} s") from None
    try:
        yield
    finally:
        lock.release()


def check_writable(*paths: Path | str) -> None:
    """Refuse, before any work, an output whose folder cannot be written (a read-only disk, no permission).

    Checks the nearest folder that exists, creating nothing.
    """
    for path in map(Path, paths):
        folder = _existing(path.absolute())
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            reason = "a read-only file system" if _read_only(folder) else "no permission to write"
            raise InputError(f"{path}: cannot write in {folder} ({reason}); make it writable or choose another folder")


#: How a full disk is worded where no errno comes with it: TensorFlow's C++ writers, SQLite (SQLITE_FULL).
_FULL_WORDS = ("No space left on device", "Disk quota exceeded", "database or disk is full")


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` says a disk filled: an OSError's errno, or the words TensorFlow's and SQLite's writers use."""
    if isinstance(err, OSError) and err.errno in _FULL:
        return True
    return any(words in str(err) for words in _FULL_WORDS)


def disk_full_line(err: BaseException) -> str:
    """The line of ``err``'s message that says the disk is full (a SQLAlchemy error has several)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return next((line for line in lines if any(words in line for words in _FULL_WORDS)), lines[0] if lines else repr(err))


def disk_full_in(folder: Path, doing: str, then: str) -> DiskFull:
    """The one line for a disk that filled under ``folder`` while ``doing``, and what a rerun does (``then``)."""
    free = _bytes(shutil.disk_usage(_existing(folder)).free)
    return DiskFull(f"no space left on the device of {folder} ({free} free there) {doing}; free some space or write "
                    f"elsewhere, and run again: {then}")


def _read_only(folder: Path) -> bool:
    return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)


def _write_error(err: OSError, target: Path, staged: Path | None, size: int | None) -> Exception:
    """The one line for ``err`` while writing ``target``: a full disk names the bytes, a read-only one the folder."""
    if err.errno in _FULL:
        written = _size(staged) if staged is not None else 0
        free = f"{_bytes(shutil.disk_usage(_existing(target.parent)).free)} free there"
        if size is not None:
            free = f"it needs {_bytes(size)}, {free}"
        elif written:
            free = f"it filled the disk after {_bytes(written)}, {free}"
        return DiskFull(f"no space left on the device of {target} ({free}); free some space or write elsewhere, and "
                        "run again: every output is as it was")
    if err.errno in _NOT_WRITABLE:
        folder = _existing(target.parent)
        reason = "a read-only file system" if _read_only(folder) else err.strerror
        return InputError(f"{target}: cannot write in {folder} ({reason}); make it writable or choose another folder")
    return err


def _existing(folder: Path) -> Path:
    """``folder``, or its nearest parent that exists."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _size(path: Path) -> int:
    """Bytes of a file, or of every file under a folder (0 for nothing)."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def _bytes(count: float) -> str:
    """``count`` bytes for a person: 812 bytes, 3.4 KiB, 1.2 MiB."""
    if count < 1024:
        return f"{int(count)} bytes"
    for unit in ("KiB", "MiB", "GiB"):
        count /= 1024
        if count < 1024 or unit == "GiB":
            break
    return f"{count:.1f} {unit}"


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
