"""Damaged state, each with a real fault: one line, the right exit code, and every output as it was.

A garbage, foreign, older, newer or locked tracking store; a full disk under
the data, the models, the reports, the backups and MLflow's artifacts; a
read-only folder; damaged backups; a damaged schema cache. One stage run each,
in-process, from one trained workspace copied per test (docs/reliability.md
lists every case).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from stages import evaluate, preprocess, train

from helpers.disks import full_disk, read_only, snapshot
from helpers.project import local_mode_environment, tiny_params, train_stage_command

TRAIN = ["--strategy", "default", "--name", "run"]


def set_(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def the_error(result) -> str:
    """The one line a failed stage printed (log lines aside), checked to be the only one and no traceback."""
    errors = [line for line in result.stderr.splitlines() if not line.startswith(("INFO ", "WARNING "))]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr[-3000:]
    assert "Traceback" not in result.output
    return errors[0]


def warnings_of(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("WARNING ")]


#: The workspace's own store, as the default params have it: a copy of a workspace has the same params,
#: so the backups' keys (which hash the store's URI) hold in the copy.
STORE = "sqlite:///mlruns/mlflow.db"


def workspace_like(source: Path, target: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of ``source`` at ``target``, with its own store, as the current folder."""
    shutil.copytree(source, target, symlinks=True)
    monkeypatch.chdir(target)
    return target


def outputs_of(root: Path, store: bool = True) -> dict[str, str]:
    """What a user trained: the data, the models, the reports, and (``store``) the tracking store's file."""
    kept = ("models/", "reports/", "data/", *(("mlruns/mlflow.db",) if store else ()))
    return {name: digest for name, digest in snapshot(root).items() if name.startswith(kept)}


def fails_leaving_outputs(root: Path, stage, args: list[str], exit_code: int, store: bool = True):
    """Run ``stage`` in ``root``: it must fail with ``exit_code`` and one line, every output as it was; the line and result."""
    before = outputs_of(root, store)
    result = CliRunner().invoke(stage.main, args)
    assert result.exit_code == exit_code, result.output[-3000:]
    line = the_error(result)
    assert outputs_of(root, store) == before
    return line, result


def runs_in(root: Path) -> dict[str, str]:
    """The store's runs and their status: a failed stage adds its own, FAILED, and changes none before it."""
    with sqlite3.connect(root / "mlruns" / "mlflow.db") as connection:
        return dict(connection.execute("SELECT run_uuid, status FROM runs"))


def kept_runs(root: Path, before: dict[str, str]) -> None:
    after = runs_in(root)
    assert {run: after.get(run) for run in before} == before, "every run before is as it was"
    assert set(after.values()) - set(before.values()) <= {"FAILED"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, prepared_dir: Path) -> Path:
    """A workspace with prepared data, one trained run (models/run, reports/train), and its store."""
    root = tmp_path_factory.mktemp("trained")
    shutil.copytree(prepared_dir, root / "data" / "prepared")
    tiny_params(root, mlflow={"tracking_uri": STORE})
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        result = CliRunner().invoke(train.main, TRAIN)
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture(scope="module")
def full_reports(trained: Path, tmp_path_factory: pytest.TempPathFactory):
    """The train stage rerun (other params) with reports/ on a full disk: what it said, and the workspace before and after."""
    with pytest.MonkeyPatch.context() as patch:
        root = workspace_like(trained, tmp_path_factory.mktemp("full-reports") / "ws", patch)
        runs = runs_in(root)
        with full_disk(root / "reports"):
            before = outputs_of(root, store=False)
            result = CliRunner().invoke(train.main, TRAIN + set_("train.epochs=3"))
            after = outputs_of(root, store=False)
        kept_runs(root, runs)
    return root, result, before, after


# -- the tracking store -------------------------------------------------------------------------------


def test_a_garbage_store_is_named_with_how_to_set_it_aside(trained, tmp_path, monkeypatch):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    store = root / "mlruns" / "mlflow.db"
    store.write_bytes(bytes(range(256)) * 16)
    line, _ = fails_leaving_outputs(root, train, TRAIN, 2)
    assert f"mlflow.tracking_uri sqlite:///{store}: not a readable MLflow store (file is not a database)" in line
    assert f"mv {store} {store}.damaged" in line


def test_a_truncated_store_is_named(trained, tmp_path, monkeypatch):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    store = root / "mlruns" / "mlflow.db"
    store.write_bytes(store.read_bytes()[: store.stat().st_size // 3])
    line, _ = fails_leaving_outputs(root, train, TRAIN, 2)
    assert "not a readable MLflow store (database disk image is malformed)" in line


def test_another_programs_database_is_not_taken_for_a_store(trained, tmp_path, monkeypatch):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    store = root / "mlruns" / "mlflow.db"
    store.unlink()
    with sqlite3.connect(store) as connection:
        connection.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    line, _ = fails_leaving_outputs(root, train, TRAIN, 2)
    assert "an SQLite database but not an MLflow store (no alembic_version table)" in line


@pytest.mark.parametrize(("revision", "says"), [
    ("75868b020152", "its schema is from an older MLflow (revision 75868b020152; MLflow "),
    ("ffff00001111", "its schema revision ffff00001111 is unknown to MLflow "),
], ids=["older", "newer"])
def test_a_store_of_another_mlflow_version_says_which_way_to_go(trained, tmp_path, monkeypatch, revision, says):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    store = root / "mlruns" / "mlflow.db"
    with sqlite3.connect(store) as connection:
        connection.execute("UPDATE alembic_version SET version_num = ?", (revision,))
    line, _ = fails_leaving_outputs(root, train, TRAIN, 2)
    assert says in line
    assert (f"mlflow db upgrade sqlite:///{store}" in line) == (revision == "75868b020152")


def hold_exclusive(store: Path, seconds: float) -> subprocess.Popen:
    """A second process holding ``BEGIN EXCLUSIVE`` on ``store`` for ``seconds``, once it says so."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time\n"
         "c = sqlite3.connect(sys.argv[1], isolation_level=None); c.execute('BEGIN EXCLUSIVE')\n"
         "print('locked', flush=True); time.sleep(float(sys.argv[2]))", str(store), str(seconds)],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_store_locked_past_the_bound_is_named_after_waiting(trained, tmp_path, monkeypatch):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    store = root / "mlruns" / "mlflow.db"
    holder = hold_exclusive(store, 120)
    try:
        before = outputs_of(root)
        started = time.monotonic()
        result = CliRunner().invoke(train.main, TRAIN + set_("mlflow.busy_timeout=2"))
        waited = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert result.exit_code == 1
    assert f"sqlite:///{store}: still locked by another program after 2 s (mlflow.busy_timeout)" in the_error(result)
    assert any(f"waiting up to 2 s (mlflow.busy_timeout) for {store}" in line for line in warnings_of(result))
    assert waited < 60, "bounded by mlflow.busy_timeout (2 s), with room for a loaded machine"
    assert outputs_of(root) == before


def test_a_store_unlocked_while_waited_for_is_used(trained, tmp_path, monkeypatch):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    holder = hold_exclusive(root / "mlruns" / "mlflow.db", 2)
    try:
        result = CliRunner().invoke(train.main, TRAIN + set_("mlflow.busy_timeout=120"))
    finally:
        holder.wait()
    assert result.exit_code == 0, result.output
    assert any("another program holds it locked" in line for line in warnings_of(result))


def test_a_store_on_a_full_disk_is_named_before_training(trained, tmp_path, monkeypatch):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    with full_disk(root / "mlruns"):
        line, result = fails_leaving_outputs(root, train, TRAIN + set_("train.epochs=3"), 1)
    assert f"mlflow.tracking_uri sqlite:///{root / 'mlruns' / 'mlflow.db'}: " in line
    assert "database or disk is full" in line and "Epoch 1/" not in result.output


def test_a_store_on_a_read_only_disk_is_named(trained, tmp_path, monkeypatch):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    with read_only(root / "mlruns"):
        line, result = fails_leaving_outputs(root, train, TRAIN, 2)
    assert f"cannot write in {root / 'mlruns'} (Read-only file system)" in line


# -- full and read-only disks ----------------------------------------------------------------------


def test_models_on_a_full_disk_leave_every_output_and_keep_the_backup(trained, tmp_path, monkeypatch):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    runs = runs_in(root)
    with full_disk(root / "models"):
        line, result = fails_leaving_outputs(root, train, TRAIN + set_("train.epochs=3"), 1, store=False)
    kept_runs(root, runs)
    assert "no space left on the device of models/run" in line
    assert "every output is as it was" in line
    (backup,) = (root / ".tfdist" / "backups" / "run").iterdir()
    assert json.loads((backup / "state.json").read_text())["history"][-1]["epoch"] == 3, "what a rerun needs"


def test_reports_on_a_full_disk_leave_the_model_as_it_was_too(full_reports):
    root, result, before, after = full_reports
    assert result.exit_code == 1
    line = the_error(result)
    assert "no space left on the device of reports/train/" in line
    assert "(it needs " in line and " bytes" in line
    assert after == before, "the new model was not put beside the old reports"


def test_a_rerun_after_a_full_disk_finishes_from_the_backup_without_training(full_reports, tmp_path, monkeypatch):
    root = workspace_like(full_reports[0], tmp_path / "ws", monkeypatch)
    result = CliRunner().invoke(train.main, TRAIN + set_("train.epochs=3"))
    assert result.exit_code == 0, result.output
    assert "every epoch is done, nothing left to train" in result.stderr
    assert "Epoch 1/" not in result.output
    assert len((root / "reports" / "train" / "history" / "run.csv").read_text().splitlines()) == 1 + 3


def test_backups_on_a_full_disk_stop_training_in_one_line(trained, tmp_path, monkeypatch):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    runs = runs_in(root)
    with full_disk(root / ".tfdist"):
        line, _ = fails_leaving_outputs(root, train, TRAIN + set_("train.epochs=3"), 1, store=False)
    assert "no space left on the device of .tfdist/backups" in line
    kept_runs(root, runs)


def test_mlflow_artifacts_on_a_full_disk_stop_in_one_line(trained, tmp_path, monkeypatch):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    runs = runs_in(root)
    with full_disk(root / "mlruns" / "artifacts-full"):  # the new experiment's artifact folder
        line, _ = fails_leaving_outputs(
            root, train, TRAIN + set_("mlflow.experiment=artifacts-full", "mlflow.log_models=true"), 1, store=False)
    assert f"no space left on the device of {root / 'mlruns' / 'artifacts-full'}/" in line
    kept_runs(root, runs)


def test_prepared_data_on_a_full_disk_leaves_the_data_and_its_summary(trained, tmp_path, monkeypatch):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    (root / "reports" / "data.json").write_text('{"source": "before"}\n')
    with full_disk(root / "data"):
        line, result = fails_leaving_outputs(root, preprocess, [], 1)
    assert f"no space left on the device of {Path('data/prepared')} (it needs " in line


def test_a_read_only_models_folder_is_refused_before_training(trained, tmp_path, monkeypatch):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    with read_only(root / "models"):
        line, result = fails_leaving_outputs(root, train, TRAIN, 2)
    assert line == (f"error: models/run: cannot write in {root / 'models' / 'run'} (a read-only file system); "
                    "make it writable or choose another folder")
    assert "Epoch 1/" not in result.output


def test_a_damaged_model_file_is_named_with_how_to_bring_it_back(trained, tmp_path, monkeypatch):
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    (model_file,) = (root / "models" / "run").rglob("*.keras")
    model_file.write_bytes(bytes(range(256)) * 8)
    before = outputs_of(root)
    result = CliRunner().invoke(evaluate.main, ["--name", "run"])
    assert result.exit_code == 2
    assert the_error(result).startswith("error: models/run holds a damaged model (")
    assert "dvc checkout models/run" in the_error(result)
    assert outputs_of(root) == before


# -- damaged backups -------------------------------------------------------------------------------


def damage_state_garbage(backup: Path) -> None:
    (backup / "state.json").write_bytes(b"\x00\xff{not json")


def damage_state_truncated(backup: Path) -> None:
    state = backup / "state.json"
    state.write_text(state.read_text()[:40])


def damage_history_gone(backup: Path) -> None:
    """Every epoch done by the checkpoint, none in the history: what crashed with an IndexError."""
    state = json.loads((backup / "state.json").read_text())
    (backup / "state.json").write_text(json.dumps({**state, "history": []}))


def damage_checkpoint_truncated(backup: Path) -> None:
    (data,) = (backup / "keras" / "chief").glob("*.data-*")
    data.write_bytes(data.read_bytes()[:100])


@pytest.mark.parametrize("damage", [damage_state_garbage, damage_state_truncated, damage_history_gone,
                                    damage_checkpoint_truncated], ids=lambda f: f.__name__[len("damage_"):])
def test_a_damaged_backup_is_set_aside_and_training_starts_afresh(full_reports, tmp_path, monkeypatch, damage):
    root = workspace_like(full_reports[0], tmp_path / "ws", monkeypatch)
    (backup,) = (root / ".tfdist" / "backups" / "run").iterdir()
    damage(backup)
    kept = snapshot(backup)
    result = CliRunner().invoke(train.main, TRAIN + set_("train.epochs=3"))
    assert result.exit_code == 0, result.output
    (aside,) = (root / ".tfdist" / "backups" / ".damaged").iterdir()
    folder, aside_folder = backup.relative_to(root), aside.relative_to(root)  # as --backups has it: relative
    assert any(f"the backup in {folder} is damaged (" in line and f"set aside in {aside_folder}; training starts afresh"
               in line for line in warnings_of(result)), warnings_of(result)
    assert snapshot(aside) == kept, "set aside as it was, for a look"
    assert "Epoch 3/3" in result.output
    assert len((root / "reports" / "train" / "history" / "run.csv").read_text().splitlines()) == 1 + 3


# -- the schema cache ------------------------------------------------------------------------------


def test_a_damaged_schema_cache_is_made_again(trained, tmp_path, monkeypatch):
    import mlflow

    from tfdist.tracking.schema import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    (root / "mlruns" / "mlflow.db").unlink()
    cache = tmp_path / "cache" / f"mlflow-{mlflow.__version__}-schema.db"
    cache.parent.mkdir()
    cache.write_bytes(b"garbage" * 100)
    result = CliRunner().invoke(train.main, TRAIN)
    assert result.exit_code == 0, result.output
    assert any(f"the schema cache {cache} is damaged; it is made again" in line for line in warnings_of(result))
    with sqlite3.connect(cache) as connection:
        assert connection.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)


def test_a_schema_cache_of_another_mlflow_revision_is_made_again(trained, tmp_path, monkeypatch):
    import mlflow

    from tfdist.config.knobs import MlflowConfig
    from tfdist.tracking.experiment import configure
    from tfdist.tracking.schema import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    configure(MlflowConfig(tracking_uri=f"sqlite:///{tmp_path}/first/mlflow.db", experiment="first"))  # makes the cache
    cache = tmp_path / "cache" / f"mlflow-{mlflow.__version__}-schema.db"
    with sqlite3.connect(cache) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '75868b020152'")
    root = workspace_like(trained, tmp_path / "ws", monkeypatch)
    (root / "mlruns" / "mlflow.db").unlink()
    result = CliRunner().invoke(train.main, TRAIN)
    assert result.exit_code == 0, result.output
    assert any(f"the schema cache {cache} is not MLflow {mlflow.__version__}'s" in line for line in warnings_of(result))


@pytest.mark.slow
def test_a_multi_worker_run_on_a_full_disk_ends_in_one_line_and_a_rerun_finishes_without_training(trained, tmp_path):
    """The launcher restarts the group after the chief's disk-full failure; its workers then resume a backup holding
    every epoch and no history of their own (they crashed with an IndexError there), and the chief says the disk
    is full again. Once there is room, a rerun finishes from the backup."""
    root = tmp_path / "ws"
    shutil.copytree(trained, root)
    command = train_stage_command(root, "multi_worker_mirrored", "mwm", "train.epochs=2")
    with full_disk(root / "reports"):
        before = outputs_of(root, store=False)
        failed = subprocess.run(command, cwd=root, env=local_mode_environment(), capture_output=True, text=True,
                                timeout=600)
        assert outputs_of(root, store=False) == before
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "IndexError" not in failed.stderr and "Traceback" not in failed.stderr
    assert "every epoch is done, nothing left to train" in failed.stderr, "the restarted group resumed"
    assert "no space left on the device of" in failed.stderr.strip().splitlines()[-2]
    rerun = subprocess.run(command, cwd=root, env=local_mode_environment(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "Epoch 1/" not in rerun.stdout + rerun.stderr
    assert len((root / "reports" / "history" / "mwm.csv").read_text().splitlines()) == 1 + 2
