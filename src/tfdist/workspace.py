"""Which workspace a stage works for, even when DVC runs it in a throwaway copy.

``dvc exp run --temp`` and queued experiments (``dvc queue start``) run each
experiment in a copy of the repository under ``<workspace>/.dvc/tmp/exps/``,
deleted when the experiment ends. Whatever a stage keeps outside DVC's
outputs (the MLflow store) must go to the real workspace, or it goes with
the copy.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Where DVC puts the copies it runs experiments in (dvc.repo.experiments.utils.EXEC_TMP_DIR under .dvc/tmp).
_EXPERIMENT_COPIES = (".dvc", "tmp", "exps")


def workspace_root(cwd: Path | None = None) -> Path:
    """The workspace a process in ``cwd`` works for: ``cwd``, or the workspace DVC copied it from."""
    here = Path(os.getcwd() if cwd is None else cwd).absolute()
    for folder in (here, *here.parents):
        if folder.parent != folder and tuple(folder.parts[-3:]) == _EXPERIMENT_COPIES:
            return folder.parent.parent.parent
    return here
