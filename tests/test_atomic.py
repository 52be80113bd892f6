"""All-or-nothing outputs: a write that fails leaves the old file, not half a new one."""

import subprocess
import sys

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
    with pytest.raises(atomic.DiskFull) as caught, atomic.atomic_outputs() as outputs:
        staged = outputs.stage(tmp_path / "out.csv", size=2048)
        raise OSError(28, "No space left on device", str(staged))  # what a write to the staged file raises
    assert str(caught.value).startswith(f"no space left on the device of {tmp_path / 'out.csv'} (it needs 2.0 KiB, ")
    assert str(caught.value).endswith("every output is as it was")


def test_check_writable_names_the_nearest_folder_and_creates_nothing(tmp_path):
    atomic.check_writable(tmp_path / "a" / "b" / "c.json")
    assert list(tmp_path.iterdir()) == []


def test_a_lock_held_by_another_process_is_waited_for_within_its_bound_and_freed_when_it_is_killed(tmp_path):
    path = tmp_path / "store.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from tfdist.atomic import exclusive_lock\n"
        f"with exclusive_lock({str(path)!r}):\n    print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TimeoutError, match="has held .*store.lock for 0 s"), atomic.exclusive_lock(path, 0.3):
            pass
    finally:
        holder.kill()  # SIGKILL: no finally of its own runs, the kernel releases the lock
        holder.wait(timeout=30)
    with atomic.exclusive_lock(path, 5.0):
        pass
