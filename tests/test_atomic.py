"""All-or-nothing outputs: a write that fails leaves the old file, not half a new one."""

import pytest

from tfdist import atomic


def test_failed_write_leaves_the_old_file_and_no_temporaries(tmp_path):
    target = tmp_path / "out.json"
    atomic.write_json(target, {"a": 1})
    with pytest.raises(RuntimeError), atomic.atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert target.read_text() == '{\n  "a": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_folder_is_replaced_whole(tmp_path):
    target = tmp_path / "dir"
    for content in ("old", "new"):
        with atomic.atomic_path(target) as tmp:
            tmp.mkdir()
            (tmp / "f").write_text(content)
    assert (target / "f").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["dir"]
