"""Keep TensorFlow's native start-up chatter off the terminal, and let everything else through.

TensorFlow's C++ code writes log lines straight to file descriptor 2, some of
them before its own log level (``TF_CPP_MIN_LOG_LEVEL``) is read: the
"All log messages before absl::InitializeLog()" banner, oneDNN's and the CUDA
stub's INFO lines, and on a machine without a GPU an ERROR line about
``cuInit``. Python cannot intercept them, so :func:`filter_native_stderr`
moves descriptor 2 onto a pipe and a thread copies each line to the real
stderr unless it is such chatter: absl-format INFO and WARNING lines, the
banner, the CUDA probe errors where no NVIDIA driver is installed, and the
ERROR records that a lost peer causes (collectives aborted, functions that
cannot be removed from it at exit): the Python error says the same, and
:mod:`tfdist.cluster.peer_loss` turns it into one line. Every other line passes,
Python's own (tracebacks, ``error: ...``, logging) and
TensorFlow's ERROR and FATAL lines alike, so an error that matters still
reaches the user.

Every process the project starts (each stage, each worker) calls it before
TensorFlow loads; ``TFDIST_TF_LOGS=1`` turns it off, for debugging.

A process ending at once (:func:`exit_now`) must let the filter drain first,
so this module also ends processes, and knows whether this one will end
without the interpreter's teardown (:func:`end_without_teardown`).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

#: Set to 1 to see TensorFlow's native log lines again.
SHOW_ENV = "TFDIST_TF_LOGS"
_ABSL_INFO_OR_WARNING = re.compile(rb"^[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w.+-]+:\d+\] ")
_BANNER = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_CUDA_PROBE = re.compile(rb"^E\d{4} .*\] failed call to cuInit: ")
_LOST_PEER_RECORD = re.compile(rb"^E\d{4} [^\]]*\] (BaseCollectiveExecutor::StartAbort |Aborting \w+ with "
                               rb"|Failed to (?:remove|register) function remotely )")
#: The lines such a record continues on: only these are dropped after it, anything else shows.
_ABORT_CONTINUATION = (b"RPC: /tensorflow.", b"/job:", b"The tasks have crashed", b"The error could be from a previous",
                       b"Collective ops is aborted", b"Error reported from", b"Additional GRPC error information",
                       b"The following tasks are unhealthy", b":UNKNOWN:Error received from peer",
                       b"This could happen if the remote target has been disconnected")

_state: dict[str, Any] = {}


def is_chatter(line: bytes, has_nvidia_driver: bool) -> bool:
    """Whether one line of native stderr is start-up chatter (dropped) rather than something to show."""
    line = line.rstrip(b"\r\n")
    if line == _BANNER or _ABSL_INFO_OR_WARNING.match(line):
        return True
    return not has_nvidia_driver and bool(_CUDA_PROBE.match(line))


class ChatterFilter:
    """Decides line by line, remembering whether the last record shown or dropped continues on the next line."""

    def __init__(self, has_nvidia_driver: bool):
        self.has_nvidia_driver = has_nvidia_driver
        self._in_abort_record = False

    def shows(self, line: bytes) -> bool:
        line = line.rstrip(b"\r\n")
        if self._in_abort_record and (not line.strip() or line.startswith(_ABORT_CONTINUATION)):
            return False
        self._in_abort_record = bool(_LOST_PEER_RECORD.match(line))
        return not (self._in_abort_record or is_chatter(line, self.has_nvidia_driver))


def nvidia_driver_present() -> bool:
    """A CUDA initialisation failure matters only where an NVIDIA driver is installed."""
    return Path("/proc/driver/nvidia").exists() or Path("/dev/nvidia0").exists()


def filter_native_stderr() -> bool:
    """Route descriptor 2 through the chatter filter for the rest of this process; True if it now does.

    A no-op when ``TFDIST_TF_LOGS=1``, when already installed, or where stderr is not a descriptor.
    """
    if os.environ.get(SHOW_ENV) == "1" or _state:
        return False
    try:
        sys.stderr.flush()
        real = os.dup(2)
    except (OSError, ValueError):
        return False
    read_end, write_end = os.pipe()
    pipe = os.fstat(write_end).st_ino
    os.dup2(write_end, 2)
    os.close(write_end)
    pump = threading.Thread(target=_pump, args=(read_end, real, nvidia_driver_present()), name="native-stderr",
                            daemon=True)
    pump.start()
    _state.update(real=real, pump=pump, pipe=pipe)
    atexit.register(restore)
    return True


def real_stderr_fd() -> int:
    """The descriptor of the terminal's (or DVC's) stderr: 2, or where the filter keeps it."""
    return int(_state.get("real", 2))


def restore() -> None:
    """Put the real stderr back on descriptor 2 and let the filter drain: before exit, exec or ``os._exit``."""
    if not _state:
        return
    real, pump, pipe = int(_state.pop("real")), _state.pop("pump"), _state.pop("pipe")
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    if os.fstat(2).st_ino == pipe:  # not if something else took descriptor 2 since (a muted coordinator)
        os.dup2(real, 2)  # closes this process's last write end of the pipe: the pump reads to its end
    pump.join(timeout=2)
    os.close(real)


_without_teardown: list[bool] = []


def end_without_teardown() -> None:
    """Declare that this process will end through :func:`exit_now`, without the interpreter's teardown.

    ``tfdist_cli.contract.run_stage`` declares it for every pipeline stage. What is
    costly to destroy may then be kept until the end
    (:func:`tfdist.tf_private.inputs_kept_alive`).
    """
    _without_teardown.append(True)


def ends_without_teardown() -> bool:
    """Whether :func:`end_without_teardown` was declared in this process."""
    return bool(_without_teardown)


def exit_now(code: int) -> NoReturn:
    """End this process with ``code`` at once (no interpreter teardown), after what it printed reaches stderr."""
    sys.stdout.flush()
    restore()  # os._exit would lose what the filter has not passed on yet
    sys.stderr.flush()
    os._exit(code)


def mute_native_stderr() -> None:
    """Silence what native code writes to stderr; Python's ``sys.stderr`` still prints.

    For a coordinator whose remote tasks are gone: as the failed run unwinds,
    TensorFlow deletes its functions on the (dead) workers and its C++ logging
    prints dozens of gRPC errors, burying the one-line error that says what
    happened. Python's stderr moves to a copy of the terminal's descriptor, so
    that line (and Python logging) still reach the user.
    """
    sys.stderr.flush()
    python_stderr = os.fdopen(os.dup(real_stderr_fd()), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    for handler in logging.root.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
            handler.setStream(python_stderr)
    sys.stderr = python_stderr
    logging.getLogger("tensorflow").setLevel(logging.CRITICAL)  # its follow-up errors, same story


def exec_program(path: str, args: Sequence[str]) -> NoReturn:
    """Replace this process by ``path`` with ``args``, the real stderr on descriptor 2.

    Every exec of a filtered process goes through here: the filter's thread does not
    survive ``exec``, so the new program would write into a pipe nobody reads and die.
    """
    sys.stdout.flush()
    restore()
    os.execv(path, list(args))


def _pump(read_end: int, real: int, has_nvidia_driver: bool) -> None:
    chatter = ChatterFilter(has_nvidia_driver)
    pending = b""
    while chunk := os.read(read_end, 65536):
        *lines, pending = (pending + chunk).split(b"\n")
        shown = b"".join(line + b"\n" for line in lines if chatter.shows(line))
        if shown:
            os.write(real, shown)
    if pending and chatter.shows(pending):
        os.write(real, pending)
    os.close(read_end)
