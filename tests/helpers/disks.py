"""Real damaged disks for tests: a full one and a read-only one, each a tmpfs mounted over a folder.

Needs root (``mount``): CI runs as root; elsewhere the tests that use these skip.
What the folder held is copied onto the tmpfs first, so a test compares it
byte for byte before and after.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")


@contextlib.contextmanager
def _tmpfs_over(folder: Path, *options: str) -> Iterator[None]:
    """A tmpfs mounted over ``folder`` (created if missing), holding a copy of what it held."""
    need_root()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as keep:
        shutil.copytree(folder, keep, dirs_exist_ok=True)
        held = sum(path.stat().st_size + 4096 for path in Path(keep).rglob("*"))  # a page or more each
        size = held + (1 << 20)  # room for what it holds, then filled to the last page by full_disk
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
        try:
            shutil.copytree(keep, folder, dirs_exist_ok=True)
            for option in options:
                subprocess.run(["mount", "-o", f"remount,{option}", str(folder)], check=True)
            yield
        finally:
            subprocess.run(["umount", "-l", str(folder)], check=True)


@contextlib.contextmanager
def full_disk(folder: Path) -> Iterator[None]:
    """``folder`` on a disk with no byte free."""
    with _tmpfs_over(folder):
        filler = folder / ".filler"
        with contextlib.suppress(OSError), open(filler, "wb", buffering=0) as handle:
            while True:
                handle.write(b"\0" * 4096)
        assert shutil.disk_usage(folder).free < 4096
        yield


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` on a read-only file system (root's permissions do not get past it, as they do past chmod)."""
    with _tmpfs_over(folder, "ro"):
        yield


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (a full disk's filler and a store's lock files aside) with its content hash."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != ".filler" and not path.name.endswith(".lock")
    }
