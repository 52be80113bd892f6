"""Outputs that appear whole or not at all.

DVC caches whatever a stage leaves behind, so a stage killed halfway must not
leave a truncated file in place: everything is written under a temporary name
in the same folder and renamed into place, which is atomic on POSIX. A killed
stage's temporaries are swept by the next (:func:`sweep_staging`), and the
named crash points at the end of this module let tests prove all of it by
killing stages for real at every step.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import errno
import fcntl
import glob
import io
import json
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from tfdist import native_logs
from tfdist.errors import DiskFull, InputError

log = logging.getLogger(__name__)

#: What a full disk says (a quota counts as one), and a folder that cannot be written.
_FULL = (errno.ENOSPC, errno.EDQUOT)
_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


class Outputs:
    """Several outputs replaced together: each staged beside its target, all renamed once every one is whole.

    A stage that writes a model and its reports must not leave a new model
    beside old reports because the reports' disk filled: until :meth:`commit`,
    every target is as it was. Each staging folder is locked (``flock`` on the
    folder) while its process lives, so a later stage tells a killed run's
    debris from a living run's work (:func:`sweep_staging`).

    Args:
        crash_points: a stage's own outputs: pass the ``outputs.*`` crash points
            (:func:`crash_point`) as they are staged and committed.
    """

    def __init__(self, crash_points: bool = False) -> None:
        self._staged: list[tuple[Path, Path, Path, int | None]] = []  # (target, its temporary folder, staged, size)
        self._locks: list[int] = []
        self.crash_points = crash_points

    def stage(self, target: Path | str, size: int | None = None) -> Path:
        """A temporary path beside ``target`` to write it at (``size``: the bytes it will take, if known)."""
        target = Path(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=_staging_prefix(target), suffix=".tmp", dir=target.parent))
        except OSError as err:
            raise _write_error(err, target, None, size) from None
        self._locks.append(_lock_folder(tmp))
        self._staged.append((target, tmp, tmp / target.name, size))
        return tmp / target.name

    def commit(self) -> None:
        """Rename every staged output onto its target (a folder replaces a folder)."""
        for target, _, staged, _ in self._staged:
            if not staged.exists():
                raise FileNotFoundError(f"nothing was written for {target}")
        self._crash_point("outputs.staged")
        renames = 0
        for target, tmp, staged, _ in self._staged:
            moves = [(target, tmp / (target.name + ".old"))] if staged.is_dir() and target.is_dir() else []
            for source, destination in [*moves, (staged, target)]:
                os.replace(source, destination)
                renames += 1
                if renames == 1:  # the first output in place, or a folder's old one moved away: the rest not yet
                    self._crash_point("outputs.commit")
        self._crash_point("outputs.committed")

    def discard(self) -> None:
        """Remove every temporary, staged or replaced, and release their locks."""
        for _, tmp, _, _ in self._staged:
            shutil.rmtree(tmp, ignore_errors=True)
        for fd in self._locks:
            os.close(fd)
        self._staged.clear()
        self._locks.clear()

    def _crash_point(self, name: str) -> None:
        if self.crash_points:
            crash_point(name)

    def failed(self, err: OSError) -> Exception:
        """``err`` as the error a user reads, when it is a full disk or a folder that cannot be written."""
        written = err.filename2 or err.filename  # a copy's error names its source first, then where it wrote
        for target, _, staged, size in reversed(self._staged):
            if written is None or str(written).startswith(str(staged.parent)):
                return _write_error(err, target, staged, size)
        return _write_error(err, Path(written), None, None) if written else err


@contextlib.contextmanager
def atomic_outputs(crash_points: bool = False) -> Iterator[Outputs]:
    """Stage outputs with :meth:`Outputs.stage` in the block; all replace their targets when it ends without error.

    ``crash_points``: these are a stage's outputs (see :class:`Outputs`).
    """
    outputs = Outputs(crash_points)
    try:
        yield outputs
        outputs.commit()
    except OSError as err:
        raise outputs.failed(err) from None
    finally:
        outputs.discard()


@contextlib.contextmanager
def atomic_path(target: Path | str, size: int | None = None, crash_points: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling path; on success rename it onto ``target``.

    Works for files and folders: whatever the caller creates at the yielded
    path replaces ``target``. On error the temporary is removed and ``target``
    is left as it was; a full disk or a folder that cannot be written is
    raised as the one line a user reads (``size``: the bytes it would take).
    """
    with atomic_outputs(crash_points) as outputs:
        yield outputs.stage(target, size)


def _staging_prefix(target: Path) -> str:
    return f".{target.name}."


def _lock_folder(folder: Path) -> int:
    """An exclusive ``flock`` on a folder just made (nobody else can hold it); its descriptor, to close when done."""
    fd = _try_flock(folder)
    assert fd is not None, f"{folder} was made by this process"
    return fd


def _try_flock(folder: Path) -> int | None:
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
        fd = _try_flock(folder)
    except OSError:
        return False
    if fd is None:
        return False
    os.close(fd)
    return True


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
    while (fd := _try_flock(folder)) is None:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"another process has held {folder} for {timeout:.0f} s")
        time.sleep(0.05)
    try:
        yield
    finally:
        os.close(fd)  # releases the lock


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

# -- crash points ------------------------------------------------------------------------------------
# Named points of a stage's life where a test can make the whole stage die, for real.
#
# In the spirit of SQLite's crash tests: the claim "a stage killed at any moment
# leaves nothing behind, and its rerun ends as if it had never been killed" is
# proven by killing it at every step that writes something, not at moments a
# timer happens to hit (tests/test_crash_points.py walks every point).
#
# ``TFDIST_CRASH_AT=POINT`` (or ``POINT@N``: its N-th pass in one process) makes
# the process that reaches ``POINT`` SIGKILL the stage: the process group of the
# stage's first process and its own. A task of a local cluster (in a session of
# its own) thus takes its launcher with it, and the launcher's other tasks die
# with their parent (``PR_SET_PDEATHSIG``), as on a machine that lost power.
# The stage must lead its process group (started with ``setsid``, or
# ``start_new_session=True``): a crash must never reach the program that started
# it, so a stage that does not lead its group refuses the switch.
#
# The switch is for tests; with it unset every point is a dictionary lookup.

#: The switch: ``POINT`` or ``POINT@N``.
CRASH_ENV = "TFDIST_CRASH_AT"
#: The stage's process group, set by :func:`arm_crash_points` in its first process and inherited by its tasks.
CRASH_GROUP_ENV = "TFDIST_CRASH_GROUP"

#: The stages, by name, and the points each passes (every one in :data:`CRASH_POINTS`' order).
CRASH_STAGES = ("preprocess", "train", "evaluate", "compare")
_EVERY = CRASH_STAGES
_TRAIN = ("train",)


@dataclass(frozen=True)
class CrashPoint:
    """Where a stage can be killed: which stages pass the point, and what is on disk and in MLflow when it is hit."""

    stages: tuple[str, ...]
    state: str


#: Every point, in the order a stage passes them.
CRASH_POINTS: dict[str, CrashPoint] = {
    "start": CrashPoint(_EVERY, "params read, outputs checked writable, a killed run's staging swept; nothing written"),
    "train.strategy": CrashPoint(_TRAIN, "the strategy built (a cluster joined), no data read"),
    "train.data": CrashPoint(_TRAIN, "the prepared data and the backup read, no MLflow run opened"),
    "epoch.trained": CrashPoint(_TRAIN, "an epoch trained, not yet backed up (walked in epoch 2: epoch 1 is backed up)"),
    "backup.state": CrashPoint(_TRAIN, "an epoch's row in the backup's state.json, its weights not yet checkpointed"),
    "backup.written": CrashPoint(_TRAIN, "an epoch backed up whole (state.json and weights), its metrics not yet sent"),
    "model.written": CrashPoint(_TRAIN, "the model saved in its staging folder, not logged to the run"),
    "model.logged": CrashPoint(_TRAIN, "the model logged to the MLflow run (and registered), the summary metrics not"),
    "run.summary": CrashPoint(("train", "evaluate", "compare"),
                              "the metrics logged to the MLflow run; train's run not yet ended, no output in place"),
    "outputs.staged": CrashPoint(_EVERY, "every output written in its staging folder, none in place "
                                         "(train: its run ended FINISHED)"),
    "outputs.commit": CrashPoint(_EVERY, "the first output renamed into place (or a folder's old one moved away), "
                                         "the others not"),
    "outputs.committed": CrashPoint(_EVERY, "every output in place, the staging folders not yet removed; "
                                            "train's backup not yet removed"),
}


def crash_points_of(stage: str) -> list[str]:
    """The points ``stage`` passes, in order."""
    return [name for name, point in CRASH_POINTS.items() if stage in point.stages]


_passes: collections.Counter[str] = collections.Counter()


def arm_crash_points() -> None:
    """Record the stage's process group for its tasks, where the switch is set; a stage first thing calls it.

    Raises:
        RuntimeError: the switch is set in a process that does not lead its
            process group and has no stage group to kill: the crash would kill
            whatever started it.
    """
    wanted = os.environ.get(CRASH_ENV)
    if not wanted or os.environ.get(CRASH_GROUP_ENV):
        return
    point = wanted.partition("@")[0]
    if point not in CRASH_POINTS:
        raise RuntimeError(f"{CRASH_ENV}={wanted}: no such crash point (known: {', '.join(CRASH_POINTS)})")
    if os.getpgrp() != os.getpid():
        raise RuntimeError(f"{CRASH_ENV} is set but this stage does not lead its process group: start it with setsid")
    os.environ[CRASH_GROUP_ENV] = str(os.getpgrp())


def crash_point(name: str) -> None:
    """Kill the stage here if the switch names this point (and this is its N-th pass); otherwise nothing."""
    wanted = os.environ.get(CRASH_ENV)
    if not wanted:
        return
    assert name in CRASH_POINTS, f"undeclared crash point {name}"
    point, _, nth = wanted.partition("@")
    if point != name:
        return
    _passes[name] += 1
    if _passes[name] < int(nth or 1):
        return
    group = os.environ.get(CRASH_GROUP_ENV)
    if group is None:
        return  # not under a stage that armed the switch (a library call in a test): never kill an unknown group
    # Straight to the real stderr: lines still in the native-log filter's pipe die with the process.
    os.write(native_logs.real_stderr_fd(), f"crash point {wanted}: killing the stage (process group {group})\n".encode())
    for pgid in dict.fromkeys((int(group), os.getpgrp())):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
