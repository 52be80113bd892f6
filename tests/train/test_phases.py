"""The chief's phases, in this process: every crash point the train stage walks is passed, in the declared order."""

from tfdist.config.params import load_config
from tfdist.crash_points import crash_points_of
from tfdist.distribute.registry import get_spec
from tfdist.records.run_names import RunPaths
from tfdist.train import phases

from helpers.project import tiny_params


def test_the_chief_passes_every_train_moment_in_order_and_writes_its_outputs(tmp_path, prepared_copy, monkeypatch):
    passed: list[str] = []
    monkeypatch.setattr(phases, "crash_point", passed.append)
    config = load_config(tiny_params(tmp_path, train={"epochs": 2, "backup_every": 40}))  # a backup within an epoch
    paths = RunPaths(prepared_copy, tmp_path / "models" / "normal", tmp_path / "backups", tmp_path / "reports")

    trained = phases.train_task(config, get_spec("default"), "normal", paths, None)

    assert list(dict.fromkeys(passed)) == [point for point in crash_points_of("train") if point != "start"]
    epoch_moments = ["epoch.trained", "backup.state", "backup.written"]
    assert [point for point in passed if point in epoch_moments] == epoch_moments * 2, "each epoch's, in its order"
    assert [row["epoch"] for row in trained.history] == [1, 2]
    assert (paths.model / "MLmodel").is_file() and (tmp_path / "reports" / "normal.json").is_file()
    assert not (tmp_path / "backups" / "normal").exists(), "the backup goes once the outputs are in place"
