"""Locks that hold across processes: one process at a time on a file or folder, machine-wide, released when its
holder dies."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

import filelock


def try_flock(folder: Path) -> int | None:
    """An exclusive ``flock`` on ``folder`` itself, if no other process holds one: the descriptor that holds it
    (until closed, at the latest when the process dies; not inherited by the processes it starts); None if held.

    Raises:
        OSError: ``folder`` cannot be opened (gone, not a folder).
    """
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def exclusive_lock(path: Path | str, timeout: float | None = None) -> Iterator[None]:
    """An exclusive lock on the file or folder ``path`` for the block, one process at a time machine-wide.

    ``flock``: the kernel releases it when its holder dies, so a killed stage
    never leaves a lock that blocks the next one. A folder is locked itself
    (nothing is left in it); a file is made if missing (filelock's), and stays.

    Raises:
        TimeoutError: another process held it for ``timeout`` seconds (None: wait as long as it takes).
        OSError: the lock file cannot be created (its folder is missing or read-only).
    """
    if Path(path).is_dir():
        with _folder_lock(Path(path), timeout):
            yield
        return
    lock = filelock.FileLock(path, timeout=-1 if timeout is None else timeout)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise TimeoutError(f"another process has held {path} for {timeout:.0f} s") from None
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def _folder_lock(folder: Path, timeout: float | None) -> Iterator[None]:
    deadline = None if timeout is None else time.monotonic() + timeout
    while (fd := try_flock(folder)) is None:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"another process has held {folder} for {timeout:.0f} s")
        time.sleep(0.05)
    try:
        yield
    finally:
        os.close(fd)  # releases the lock
