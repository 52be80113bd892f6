"""Folders only their owner may enter (``tfdist.files.workspace.private_folder``), tried as another local user."""

import os

import pytest

from tfdist.errors import InputError
from tfdist.files.workspace import private_folder

from helpers.intruder import readable_by_others

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's folder needs root to make")


def test_a_new_folder_and_one_left_open_are_closed_to_other_users(tmp_path):
    tmp_path.chmod(0o755)
    made = private_folder(tmp_path / "new" / "store")
    (made / "runs.db").write_text("runs")
    assert oct(made.stat().st_mode & 0o777) == "0o700"
    opened = tmp_path / "open"
    opened.mkdir(mode=0o755)
    opened.chmod(0o755)
    (opened / "secret").write_text("keys")
    private_folder(opened)
    assert oct(opened.stat().st_mode & 0o777) == "0o700"
    if os.geteuid() == 0:
        assert not readable_by_others(made / "runs.db") and not readable_by_others(opened / "secret")


@needs_root
def test_another_users_folder_is_refused_by_name_and_left_as_it_was(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(InputError, match=f"--backups: {theirs} belongs to another user"):
        private_folder(theirs, key="--backups")
    assert theirs.stat().st_mode & 0o777 == 0o755


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="mlflow.tracking_uri x: cannot create .*file/store"):
        private_folder(tmp_path / "file" / "store", key="mlflow.tracking_uri x")
