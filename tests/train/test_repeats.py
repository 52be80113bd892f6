"""The repeat stage's bookkeeping: which repeats it trains, in which order, what it keeps, and a repeat that fails.

The trainings here are a small program with the train stage's command line that
writes its outputs (the real trainings run in tests/pipeline/test_pipeline_e2e.py):
what is tested is the order, the manifest, and what a failure and a rerun do.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stages.train import run_command
from tfdist.config.params import load_config
from tfdist.errors import InputError, RunError
from tfdist.records.run_names import planned
from tfdist.train.repeats import MANIFEST, RepeatPaths, run_repeats

from helpers.project import REPO

#: Stands in for ``python -m stages.train``: logs its run name, writes its three outputs, fails where told to.
TRAINER = """
import os, sys
from pathlib import Path
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
name = args["--name"]
with open(os.environ["ORDER_LOG"], "a") as log:
    log.write(name + "\\n")
if name == os.environ.get("FAIL_AT"):
    print("error: training diverged", file=sys.stderr)
    sys.exit(1)
(Path(args["--models"]) / name).mkdir(parents=True, exist_ok=True)
(Path(args["--reports"]) / "history").mkdir(parents=True, exist_ok=True)
(Path(args["--reports"]) / f"{name}.json").write_text("{}")
(Path(args["--reports"]) / "history" / f"{name}.csv").write_text("epoch\\n1\\n")
"""


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    first = tmp_path / "reports" / "train"
    first.mkdir(parents=True)
    for name in ("normal", "mirrored", "central_storage"):
        (first / f"{name}.json").write_text(json.dumps({"name": name}))
    monkeypatch.setenv("ORDER_LOG", str(tmp_path / "order.log"))
    monkeypatch.delenv("FAIL_AT", raising=False)
    return tmp_path


def repeat(workspace: Path, repeats: int, strategies: str = "[mirrored,central_storage]"):
    config = load_config(REPO / "params.yaml", [f"compare.repeats={repeats}", f"distributed.strategies={strategies}"])
    paths = RepeatPaths(workspace / "reports" / "train", workspace / "data", workspace / "repeats",
                        workspace / "backups")
    return run_repeats(config, paths, lambda **run: [sys.executable, "-c", TRAINER, *stage_options(**run)])


def stage_options(**run) -> list[str]:
    """The train stage's own options for a run, past its ``python -m stages.train``."""
    return run_command(REPO / "params.yaml", **run)[3:]


def order(workspace: Path) -> list[str]:
    log = workspace / "order.log"
    return log.read_text().split() if log.exists() else []


def test_planned_rounds_are_interleaved_round_after_round():
    assert [r.label for r in planned(["normal", "mirrored"], 3)] == ["normal.r2", "mirrored.r2", "normal.r3",
                                                                       "mirrored.r3"]
    assert planned(["normal", "mirrored"], 1) == []


def test_the_stage_trains_round_after_round_then_keeps_what_is_unchanged(workspace):
    repeat(workspace, 3)
    assert order(workspace) == ["normal.r2", "mirrored.r2", "central_storage.r2",
                                "normal.r3", "mirrored.r3", "central_storage.r3"]
    manifest = json.loads((workspace / "repeats" / MANIFEST).read_text())["finished"]
    assert sorted(manifest) == sorted(order(workspace))
    assert repeat(workspace, 3) == [], "nothing changed: every repeat is kept"
    repeat(workspace, 4)
    assert order(workspace)[6:] == ["normal.r4", "mirrored.r4", "central_storage.r4"], "a round added: only it trains"
    repeat(workspace, 2)
    assert sorted(p.stem for p in (workspace / "repeats" / "reports").glob("*.json")) == [
        "central_storage.r2", "mirrored.r2", "normal.r2"], "rounds dropped: their outputs removed"
    assert sorted(p.name for p in (workspace / "repeats" / "models").iterdir()) == [
        "central_storage.r2", "mirrored.r2", "normal.r2"]
    assert sorted(p.stem for p in (workspace / "repeats" / "reports" / "history").iterdir()) == [
        "central_storage.r2", "mirrored.r2", "normal.r2"]


def test_a_round_one_run_that_changed_has_its_repeats_trained_again(workspace):
    repeat(workspace, 2)
    (workspace / "reports" / "train" / "mirrored.json").write_text(json.dumps({"name": "mirrored", "rerun": True}))
    repeat(workspace, 2)
    assert order(workspace)[3:] == ["mirrored.r2"]


def test_a_failed_repeat_is_named_the_finished_ones_kept_and_a_rerun_trains_only_the_rest(workspace, monkeypatch):
    monkeypatch.setenv("FAIL_AT", "mirrored.r3")
    with pytest.raises(RunError) as failed:
        repeat(workspace, 3)
    message = str(failed.value)
    assert message.startswith("repeat mirrored.r3 failed: task mirrored.r3 (pid ")
    assert "exited with code 1" in message and "error: training diverged" in message
    assert "4 finished repeat(s) kept; run the stage again to train the 2 left (dvc repro)" in message
    monkeypatch.delenv("FAIL_AT")
    repeat(workspace, 3)
    assert order(workspace)[5:] == ["mirrored.r3", "central_storage.r3"]


def test_repeats_need_round_one_first(workspace):
    (workspace / "reports" / "train" / "central_storage.json").unlink()
    with pytest.raises(InputError, match="central_storage.json not found: the repeats need round 1 first"):
        repeat(workspace, 2)


@pytest.mark.parametrize(("value", "expected"), [
    ("0", "compare.repeats must be >= 1; got 0"),
    ("two", "compare.repeats must be a whole number; got 'two' (str)"),
    ("2.5", "compare.repeats must be a whole number; got 2.5 (float)"),
])
def test_a_repeat_count_below_one_or_not_an_integer_is_refused_in_one_line(tmp_path, value, expected):
    done = subprocess.run([sys.executable, str(REPO / "stages" / "repeat.py"), "--params", str(REPO / "params.yaml"),
                           "--set", f"compare.repeats={value}", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: {expected}"]
    assert not (tmp_path / "r").exists(), "nothing written"
