"""All-or-nothing outputs: a write that fails leaves the old file, not half a new one."""

import subprocess
import sys

import pytest

from tfdist.errors import DiskFull
from tfdist.files import atomic, disk, locks


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


def test_outputs_staged_together_replace_none_when_one_fails(tmp_path):
    model, report = tmp_path / "models" / "run", tmp_path / "reports" / "run.json"
    atomic.write_text(report, "old report")
    with pytest.raises(RuntimeError), atomic.atomic_outputs() as outputs:
        staged = outputs.stage(model)
        staged.mkdir()
        (staged / "weights").write_text("new")
        atomic.write_text(report, "new report", outputs=outputs)
        raise RuntimeError("the disk filled after the model")
    assert not model.exists() and report.read_text() == "old report"
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["run.json"], "no temporaries left"


def test_a_full_disk_is_one_line_naming_the_target_and_its_bytes(tmp_path):
    with pytest.raises(DiskFull) as caught, atomic.atomic_outputs() as outputs:
        staged = outputs.stage(tmp_path / "out.csv", size=2048)
        raise OSError(28, "No space left on device", str(staged))  # what a write to the staged file raises
    assert str(caught.value).startswith(f"no space left on the device of {tmp_path / 'out.csv'} (it needs 2.0 KiB, ")
    assert str(caught.value).endswith("every output is as it was")


def test_check_writable_names_the_nearest_folder_and_creates_nothing(tmp_path):
    disk.check_writable(tmp_path / "a" / "b" / "c.json")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_lock_held_by_another_process_is_waited_for_within_its_bound_and_freed_when_it_is_killed(tmp_path, kind):
    path = tmp_path / "store.lock"
    if kind == "folder":
        path.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from tfdist.files.locks import exclusive_lock\n"
        f"with exclusive_lock({str(path)!r}):\n    print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TimeoutError, match="has held .*store.lock for 0 s"), locks.exclusive_lock(path, 0.3):
            pass
    finally:
        holder.kill()  # SIGKILL: no finally of its own runs, the kernel releases the lock
        holder.wait(timeout=30)
    with locks.exclusive_lock(path, 5.0):
        pass
    assert kind == "file" or list(path.iterdir()) == [], "a folder is locked itself, nothing is left in it"


def _stage_and_hold(target):
    """A process that stages ``target`` and holds it there (as a stage killed mid-write would have, while alive)."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time; from tfdist.files.atomic import atomic_outputs\n"
        f"with atomic_outputs() as outputs:\n    outputs.stage({str(target)!r}).write_text('half')\n"
        "    print('staged', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "staged"
    return holder


def test_a_staging_folder_is_swept_once_its_writer_is_dead_and_not_before(tmp_path, caplog):
    target = tmp_path / "models" / "normal"
    other = tmp_path / "models" / "mirrored"
    holder, bystander = _stage_and_hold(target), _stage_and_hold(other)
    try:
        (staged,) = target.parent.glob(".normal.*.tmp")
        assert atomic.sweep_staging(target) == [], "a living writer's folder is left alone, whatever its age"
        holder.kill()  # SIGKILL: nothing of its own cleans up
        holder.wait(timeout=30)
        with caplog.at_level("INFO", logger="tfdist.files.atomic"):
            assert atomic.sweep_staging(target, tmp_path / "reports" / "normal.json") == [staged]
        assert not staged.exists() and not target.exists()
        assert f"removed 1 staging folder(s) a killed stage left: {staged}" in caplog.text
        assert len(list(target.parent.glob(".mirrored.*.tmp"))) == 1, "another output's staging is not this stage's"
    finally:
        for process in (holder, bystander):
            process.kill()
            process.wait(timeout=30)
