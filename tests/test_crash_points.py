"""Crash anywhere: every stage SIGKILLed at each of its named crash points, for real, then run again.

Each stage walks its points (tests/helpers/crash.py: killed at one, rerun to be killed at the next,
finally let finish) in one workspace, in pipeline order: preprocess, train (default through every
point; mirrored trained once beside it, for evaluate and compare to have two models), evaluate,
compare. After every kill, each output is whole or absent; at the end, the outputs are
an uninterrupted run's (weights to the byte), the training has one FINISHED MLflow run with every
epoch once, no metric twice at a step, one logged model and one registered version, and nothing is
left in the workspace: no staging folder, temporary, backup or lock. Several replicas walk across
processes (multi_worker_mirrored) in tests/train/test_crash_points_multi_process.py, parameter_server in
test_crash_points_parameter_server.py; mirrored's resume within an epoch is tests/resume/test_preemption.py's.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import mlflow
import pytest

from tfdist.crash_points import CRASH_POINTS, CRASH_STAGES, crash_points_of
from tfdist.data.prepared import SPLITS, load_spec, load_split

from helpers.crash import Workspace, debris, metrics_logged_twice_at_a_step, run_stage, walk

pytestmark = pytest.mark.slow

#: The trainings: run name and strategy; the first is walked.
TRAININGS = {"normal": "default", "mirrored": "mirrored"}
WALKED = "normal"
#: After these kills a staging folder is left, and the rerun says it removed it.
LEAVE_STAGING = ("outputs.staged", "outputs.commit", "outputs.committed")


def whole_json(path: Path) -> None:
    """A JSON output is absent or whole."""
    if path.exists():
        json.loads(path.read_text())


def staging_swept(outputs: list[str], stage: str) -> None:
    """The rerun after each kill that leaves staging said it removed it."""
    for point in LEAVE_STAGING:
        rerun = outputs[crash_points_of(stage).index(point) + 1]
        assert "staging folder(s) a killed stage left" in rerun, f"after the kill at {point}:\n{rerun[-2000:]}"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("crash"), TRAININGS, mlflow={"log_models": True, "register_models": True})


@pytest.fixture(scope="module")
def preprocessed(workspace) -> list[str]:
    def after_kill(point: str) -> None:
        whole_json(workspace.reports / "data.json")
        if workspace.prepared.exists():  # whole: every file spec.json lists, at its size, and nothing else
            spec = load_spec(workspace.prepared)
            files = {path.name for name in SPLITS for path in load_split(workspace.prepared, name, spec).paths}
            assert {p.name for p in workspace.prepared.iterdir()} == {"spec.json", *files}

    return walk("preprocess", workspace.preprocess(), after_kill)


@pytest.fixture(scope="module")
def trained(workspace, preprocessed) -> list[str]:
    """The walked training's outputs, removed after the kill that came once they were in place, as DVC would; the
    others trained once.

    (``dvc repro`` deletes a stage's outputs before it runs it again: dvc.lock was
    not written, so the outputs are not known to be the stage's.)
    """
    report, model = workspace.reports / "train" / f"{WALKED}.json", workspace.models / WALKED
    history = workspace.reports / "train" / "history" / f"{WALKED}.csv"

    def after_kill(point: str) -> None:
        whole_json(report)
        assert not model.exists() or (model / "MLmodel").is_file(), f"{point}: a model folder without its MLmodel"
        if history.exists():
            assert len(list(csv.DictReader(history.open()))) == 2
        if point in ("outputs.commit", "outputs.committed"):
            (state,) = (workspace.backups / WALKED).glob("*/state.json")
            assert len(json.loads(state.read_text())["history"]) == 2, "the backup is kept until the commit ends"
        if point == "backup.step":
            (state,) = (workspace.backups / WALKED).glob("*/steps/steps.json")
            assert json.loads(state.read_text())["step"] == 20, "steps.json still names the backup before"
        if point == "outputs.committed":
            shutil.rmtree(model)
            report.unlink()
            history.unlink()

    outputs = walk("train", workspace.train(WALKED), after_kill)
    for name in TRAININGS.keys() - {WALKED}:
        done = run_stage(workspace.train(name))
        assert done.returncode == 0, done.stderr[-3000:]
    return outputs


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, workspace, preprocessed) -> Workspace:
    """The walked training, never killed, on the same prepared data (weights' digests to match)."""
    reference = Workspace(tmp_path_factory.mktemp("uninterrupted"), TRAININGS)
    shutil.copytree(workspace.prepared, reference.prepared)
    done = run_stage(reference.train(WALKED))
    assert done.returncode == 0, done.stderr[-3000:]
    return reference


def test_every_point_is_walked_by_a_stage_and_documented():
    assert {stage for point in CRASH_POINTS.values() for stage in point.stages} <= set(CRASH_STAGES)
    table = (Path(__file__).parents[1] / "docs" / "reliability.md").read_text()
    for point in CRASH_POINTS:
        assert f"| `{point}` |" in table, f"docs/reliability.md has no row for crash point {point}"


def test_preprocess_killed_at_each_point_prepares_the_data_of_an_uninterrupted_run(workspace, preprocessed,
                                                                                   prepared_dir):
    for split in SPLITS:  # the same files, byte for byte
        walked = load_split(workspace.prepared, split, load_spec(workspace.prepared))
        fresh = load_split(prepared_dir, split, load_spec(prepared_dir))
        assert [path.read_bytes() for path in walked.paths] == [path.read_bytes() for path in fresh.paths]
    assert json.loads((workspace.reports / "data.json").read_text())["sha256"]
    staging_swept(preprocessed, "preprocess")


def test_a_training_killed_at_each_point_ends_as_an_uninterrupted_one(workspace, trained, uninterrupted):
    name = WALKED
    report = json.loads((workspace.reports / "train" / f"{name}.json").read_text())
    fresh = json.loads((uninterrupted.reports / "train" / f"{name}.json").read_text())
    assert report["weights_sha256"] == fresh["weights_sha256"], "resumed at every step, the same weights to the byte"
    assert report["epochs"] == 2 and (workspace.models / name / "MLmodel").is_file()
    assert not (workspace.backups / name).exists(), "the backup is removed once the outputs are in place"
    staging_swept(trained, "train")
    assert "not logging it again" in "".join(trained), "a rerun once the model was logged does not log it again"
    backup_step = trained[crash_points_of("train").index("backup.step") + 1]  # the rerun after that kill
    assert "resuming within epoch 1: its steps 1-20 are done" in backup_step, backup_step[-3000:]

    run = workspace.training_run(name)
    assert run.info.run_id == report["mlflow_run_id"]
    client = mlflow.MlflowClient()
    logged = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")
    assert len(logged) == 1, "one logged model"
    assert len(client.search_model_versions(f"run_id = '{run.info.run_id}'")) == 1, "one registered version"
    assert debris(workspace.models) == debris(workspace.reports) == [] and not list(workspace.backups.glob("*/*"))


@pytest.fixture(scope="module")
def evaluated(workspace, trained) -> list[str]:
    def after_kill(point: str) -> None:
        for name in TRAININGS:
            whole_json(workspace.reports / "eval" / f"{name}.json")

    return walk("evaluate", workspace.evaluate(), after_kill)


def test_evaluate_killed_at_each_point_reports_what_an_uninterrupted_one_does(workspace, evaluated):
    staging_swept(evaluated, "evaluate")
    done = run_stage(workspace.evaluate("eval-uninterrupted"))
    assert done.returncode == 0, done.stderr[-3000:]
    for name in TRAININGS:
        for report in (f"{name}.json", f"confusion/{name}.csv"):
            assert ((workspace.reports / "eval" / report).read_bytes()
                    == (workspace.reports / "eval-uninterrupted" / report).read_bytes())
    workspace.track()
    for run in mlflow.search_runs(experiment_names=["tests"], filter_string="tags.stage = 'train'", output_format="list"):
        assert "test_accuracy" in mlflow.get_run(run.info.run_id).data.metrics
        assert metrics_logged_twice_at_a_step(run.info.run_id) == {}, "evaluated four times, logged once"


def test_compare_killed_at_each_point_writes_the_comparison_and_logs_it_once(workspace, evaluated):
    def after_kill(point: str) -> None:
        compared = workspace.reports / "compare"
        if compared.exists():
            assert {"compare.json", "compare.md", "compare.html", "metrics.json"} <= {p.name for p in compared.iterdir()}

    outputs = walk("compare", workspace.compare(), after_kill)
    staging_swept(outputs, "compare")
    done = run_stage(workspace.compare("compare-uninterrupted"))
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("compare.json", "metrics.json", "curves.csv", "compare.md"):
        assert ((workspace.reports / "compare" / name).read_bytes()
                == (workspace.reports / "compare-uninterrupted" / name).read_bytes())
    workspace.track()
    for run in mlflow.search_runs(experiment_names=["tests"], output_format="list"):
        assert metrics_logged_twice_at_a_step(run.info.run_id) == {}, run.data.tags
    assert debris(workspace.root) == [], "no staging folder, temporary or lock anywhere in the workspace"
