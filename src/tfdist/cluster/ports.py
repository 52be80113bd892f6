"""The port book: loopback ports no two live local launchers of one user are ever given both.

The kernel hands a probed port out again as soon as the probe closes, so two
launches starting at once (``dvc queue start -j 2``) could be given the same
port before either's tasks bind it. The book (a JSON file under a lock) records
which ports each launcher process holds; a dead launcher's ports are free again.
It is the user's own: in a folder of the temp folder that only they may enter
(``tfdist-<uid>``, 0700), refused when it is a link, another user's, or open to others.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import tempfile
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

from tfdist.errors import RunError
from tfdist.files.locks import exclusive_lock

LOOPBACK = "127.0.0.1"

#: The ports live local launchers hold, machine-wide (JSON, under the lock beside it): TMPDIR moves it.
PORT_BOOK = "tfdist-ports.json"
#: Probe sockets to try before giving up on finding unheld ports.
_PORT_TRIES = 200
#: Set to a port, each cluster task serves TensorFlow's profiler on it plus the task's place in the cluster
#: (:func:`tfdist.train.server.profiler_order`), for TensorBoard's capture or ``tf.profiler.experimental.client.trace``.
PROFILER_PORT_ENV = "TFDIST_PROFILER_PORT"


def profiler_ports(tasks: int) -> range:
    """The ports a cluster of ``tasks`` tasks serves TensorFlow's profiler on (:data:`PROFILER_PORT_ENV`), if set."""
    base = os.environ.get(PROFILER_PORT_ENV, "")
    return range(int(base), int(base) + tasks) if base.isdigit() else range(0)


def free_ports(count: int, host: str = LOOPBACK, avoid: Collection[int] = ()) -> list[int]:
    """``count`` distinct ports free on ``host`` now and held by no other live tfdist launcher; held for this one.
    None of ``avoid`` (ports the tasks will bind for something else: :func:`profiler_ports`).

    The kernel hands a probed port out again as soon as the probe closes, so
    two launches starting at once (``dvc queue start -j 2``) could be given
    the same port before either's tasks bind it. The port book records which
    ports each launcher process holds; a dead launcher's are free again.
    Release them with :func:`release_ports` when the cluster stops.

    Raises:
        RunError: no such ports after many tries (the ephemeral range is exhausted).
    """
    with _port_book() as book:
        for port in [port for port, pid in book.items() if not _alive(pid)]:
            del book[port]  # its launcher is gone
        held = {int(port) for port in book} | set(avoid)
        chosen: list[int] = []
        sockets = []
        try:
            for _ in range(_PORT_TRIES):
                if len(chosen) == count:
                    break
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                try:
                    sock.bind((host, 0))
                except OSError:
                    break  # the kernel has no free port left in its range
                port = sock.getsockname()[1]
                if port not in held and port not in chosen:
                    chosen.append(port)
        finally:
            for sock in sockets:
                sock.close()
        if len(chosen) < count:
            raise RunError(f"no {count} free ports on {host} that another tfdist launch does not hold "
                           f"({len(held)} held); wait for it, or widen net.ipv4.ip_local_port_range")
        book.update({str(port): os.getpid() for port in chosen})
        return chosen


def release_ports(ports: Sequence[int]) -> None:
    """Give back ports :func:`free_ports` held for this process."""
    with _port_book() as book:
        for port in ports:
            if book.get(str(port)) == os.getpid():
                del book[str(port)]


@contextlib.contextmanager
def _port_book() -> Iterator[dict[str, int]]:
    """The port book as ``{port: launcher pid}``, read and written back under an exclusive lock."""
    path = book_folder() / PORT_BOOK
    with exclusive_lock(path.with_name(PORT_BOOK + ".lock")), open(path, "a+", encoding="utf-8") as handle:
        handle.seek(0)
        text = handle.read()
        try:
            book = {str(port): int(pid) for port, pid in json.loads(text).items()} if text.strip() else {}
        except (ValueError, AttributeError):
            book = {}  # a torn or foreign file: start a new book
        yield book
        handle.seek(0)
        handle.truncate()
        json.dump(book, handle)
        handle.flush()


def book_folder() -> Path:
    """The user's own folder for the port book, made 0700; RunError when what is there is not theirs alone.

    Everything in it is then the user's: no other user can plant a link there
    that the book would follow, or read and rewrite the book.
    """
    folder = Path(tempfile.gettempdir()) / f"tfdist-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise RunError(f"{folder} is not a folder of this user's alone (uid {found.st_uid}, mode "
                       f"{stat.filemode(found.st_mode)}): remove it, or set TMPDIR to a folder of your own")
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True
