"""The memory allocator a training process runs with (``runtime.allocator``): preloaded by re-executing the process,
as ``LD_PRELOAD`` only takes effect when a program starts."""

from __future__ import annotations

import ctypes.util
import logging
import os
import sys
from pathlib import Path

from tfdist.errors import InputError
from tfdist.model_kinds import model_kind as model_kind_of
from tfdist.native_logs import exec_program

log = logging.getLogger(__name__)

#: Each allocator ``runtime.allocator`` can preload: the name ``ctypes.util.find_library`` knows it by, and its
#: Debian package.
ALLOCATOR_LIBRARIES = {"jemalloc": ("jemalloc", "libjemalloc2"), "tcmalloc": ("tcmalloc_minimal", "libtcmalloc-minimal4")}

#: Set in the environment of a process this module re-executed, so that a preload that did not take is not retried.
_REEXECUTED = "TFDIST_ALLOCATOR_PRELOADED"


def allocator_library(setting: str, kind: str) -> tuple[str, str | None]:
    """The allocator ``runtime.allocator`` resolves to here for model ``kind``, and the library to preload (None:
    glibc's malloc). ``auto`` preloads one only for a kind whose record says it gains (``preloads_allocator``).

    Raises:
        InputError: a named allocator that is not installed.
    """
    if setting == "system" or (setting == "auto" and not model_kind_of(kind).preloads_allocator):
        return "system", None
    for name in (ALLOCATOR_LIBRARIES if setting == "auto" else (setting,)):
        soname, package = ALLOCATOR_LIBRARIES[name]
        if found := ctypes.util.find_library(soname):
            return name, found
        if setting != "auto":
            raise InputError(f"runtime.allocator {setting}: lib{soname} is not installed here; install Debian's "
                             f"{package} (make install does) or set runtime.allocator: auto")
    return "system", None


def allocator_in_use() -> str:
    """The allocator this process runs with: a preloadable one mapped into it, else ``system``."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "system"
    return next((name for name, (soname, _) in ALLOCATOR_LIBRARIES.items() if f"lib{soname}" in maps), "system")


def run_under_allocator(setting: str, kind: str) -> None:
    """Re-execute this process with ``runtime.allocator``'s library for model ``kind`` preloaded, unless it runs
    with it already.

    A training process calls it before it does anything else (no file written,
    TensorFlow not loaded): ``LD_PRELOAD`` only takes effect when a program
    starts. Its children (a local cluster's tasks) inherit the preload. glibc's
    malloc returns the large buffers TensorFlow's gRPC exchanges allocate to the
    kernel and faults them in again every step; jemalloc and tcmalloc keep them
    (docs/performance/parallelism.md 8b).
    """
    name, library = allocator_library(setting, kind)
    if library is None or allocator_in_use() == name:
        return
    if os.environ.get(_REEXECUTED):
        log.warning("runtime.allocator %s: %s was preloaded but is not in use; running with glibc's malloc", setting,
                    library)
        return
    os.environ["LD_PRELOAD"] = " ".join(filter(None, (library, os.environ.get("LD_PRELOAD"))))
    os.environ[_REEXECUTED] = "1"
    exec_program(sys.executable, [sys.executable, *sys.orig_argv[1:]])
