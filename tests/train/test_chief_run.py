"""A training run's phases, one at a time, in this process (no stage, no subprocess)."""

import os

from tfdist.config import load_config
from tfdist.distribute.registry import get_spec
from tfdist.reports import RunPaths, TrainReport, read_report, write_report
from tfdist.tracking_outage import Patience
from tfdist.train.chief_run import ChiefRun
from tfdist.train.precision import hardware_support
from tfdist.train.step_costs import Costs

from helpers.project import tiny_params


def test_the_phases_of_a_chief_run_one_by_one(tmp_path, prepared_copy):
    config = load_config(tiny_params(tmp_path, train={"epochs": 1}))
    paths = RunPaths(prepared_copy, tmp_path / "models" / "phases", tmp_path / "backups")
    run = ChiefRun(config, get_spec("default"), "phases", paths)

    run.start()
    assert run.info.name == "default" and run.info.replicas == 1
    run.load()
    assert len(run.train_split) == 3600 and len(run.val_split) == 400
    assert run.backup.folder == tmp_path / "backups" / "phases" / run.key and not run.stale
    run.open()  # the store exists now, before any training
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()

    result = run.fit()
    assert [row["epoch"] for row in result.history] == [1]
    assert (run.backup.folder / "state.json").is_file(), "the epoch was backed up"
    digest = run.save(result, paths.model, Patience(30.0, "the test store"))
    assert (paths.model / "MLmodel").is_file() and len(digest) == 64

    report = run.report(result, digest, "", hardware_support("float32"), cpu_percent=50.0, costs=Costs([1], 0))
    assert isinstance(report, TrainReport) and report.run_label == "phases · fit · float32"
    assert report.paradigm == "none" and report.hardware.cpu_cores == os.cpu_count()
    assert report.hardware.device_kinds in (["CPU"], ["GPU"]) and report.weights_sha256 == digest
    write_report(tmp_path / "phases.json", report)
    assert read_report(tmp_path / "phases.json", TrainReport) == report
