"""The programs a command runs (dvc, SeaweedFS's weed): the environment's own first, then PATH's."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tfdist.errors import InputError


def program(name: str) -> str | None:
    """The executable ``name`` beside this Python (the venv's: dvc, weed), else on PATH, else None."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if os.access(beside, os.X_OK) else shutil.which(name)


def required_program(name: str, fix: str) -> str:
    """:func:`program` ``name``, or InputError "NAME is not on PATH; FIX"."""
    found = program(name)
    if found is None:
        raise InputError(f"{name} is not on PATH; {fix}")
    return found
