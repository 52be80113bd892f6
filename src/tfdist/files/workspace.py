"""Which workspace a stage works for, even when DVC runs it in a throwaway copy.

``dvc exp run --temp`` and queued experiments (``dvc queue start``) run each
experiment in a copy of the repository under ``<workspace>/.dvc/tmp/exps/``,
deleted when the experiment ends. Whatever a stage keeps outside DVC's
outputs (the MLflow store) must go to the real workspace, or it goes with
the copy. Those files (runs, backups, a team's objects, an auth database) go in
folders only their owner may enter (:func:`private_folder`): a workspace on a shared
machine is often under a world-readable home, and the folder's mode guards every file
in it, whatever the files' own modes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tfdist.errors import InputError

#: Where DVC puts the copies it runs experiments in (dvc.repo.experiments.utils.EXEC_TMP_DIR under .dvc/tmp).
_EXPERIMENT_COPIES = (".dvc", "tmp", "exps")


def workspace_root(cwd: Path | None = None) -> Path:
    """The workspace a process in ``cwd`` works for: ``cwd``, or the workspace DVC copied it from."""
    here = Path(os.getcwd() if cwd is None else cwd).absolute()
    for folder in (here, *here.parents):
        if folder.parent != folder and tuple(folder.parts[-3:]) == _EXPERIMENT_COPIES:
            return folder.parent.parent.parent
    return here


def private_folder(path: Path | str, *, key: str = "") -> Path:
    """``path`` as a folder only this user may enter (created with its parents); InputError when it cannot be.

    A folder of another user's is refused by name (``key``: the option or knob that named it), not changed.
    """
    folder = Path(path)
    named = f"{key}: " if key else ""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        found = folder.stat()
        if found.st_uid != os.geteuid():
            raise InputError(f"{named}{folder} belongs to another user (uid {found.st_uid}); choose a folder of your own")
        if stat.S_IMODE(found.st_mode) & 0o077:
            folder.chmod(stat.S_IMODE(found.st_mode) & 0o700)
    except OSError as err:
        raise InputError(f"{named}cannot create {folder} ({err.strerror})") from None
    return folder
