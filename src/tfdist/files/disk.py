"""A disk that cannot take a stage's outputs, told in one line: full (with the bytes it needed), read-only, or not
the user's to write; checked before any work where it can be."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from tfdist.errors import DiskFull, InputError

#: What a full disk says (a quota counts as one), and a folder that cannot be written.
_FULL = (errno.ENOSPC, errno.EDQUOT)

_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def check_writable(*paths: Path | str) -> None:
    """Refuse, before any work, an output whose folder cannot be written (a read-only disk, no permission).

    Checks the nearest folder that exists, creating nothing.
    """
    for path in map(Path, paths):
        folder = _existing(path.absolute())
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            reason = "a read-only file system" if read_only(folder) else "no permission to write"
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


def read_only(folder: Path) -> bool:
    """Whether ``folder`` is on a file system mounted read-only."""
    return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)


def write_error(err: OSError, target: Path, staged: Path | None, size: int | None) -> Exception:
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
        reason = "a read-only file system" if read_only(folder) else err.strerror
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
