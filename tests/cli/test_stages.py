"""Each stage through click's CliRunner: outputs written, exit codes per the contract."""

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from click.testing import CliRunner

from stages import compare, evaluate, preprocess, train
from tfdist.hardware import usable_cpus

from helpers.devices import SPLIT_REPLICAS
from helpers.intruder import readable_by_others
from helpers.project import tiny_params


def invoke(command, *args):
    return CliRunner().invoke(command.main, [str(a) for a in args])


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny_params(tmp_path)
    return tmp_path


def test_preprocess_writes_data_and_summary(workdir):
    result = invoke(preprocess, "--set", "data.validation_split=0.2")
    assert result.exit_code == 0, result.output
    summary = json.loads((workdir / "reports" / "data.json").read_text())
    assert summary["source"] == "MNIST sample" and summary["splits"]["val"]["total"] == 800
    assert len(summary["sha256"]) == 64
    names = sorted(p.name for p in (workdir / "data" / "prepared").iterdir())
    assert names[:2] == ["spec.json", "test-00000-of-00016.tfrecord"] and len(names) == 1 + 3 * 16


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "train.epochs=0"], "error: train.epochs must be >= 1; got 0"),
        (["--set", "train.epoch=3"], "error: unknown key train.epoch; did you mean train.epochs?"),
        (["--params", "missing.yaml"], "error: params file missing.yaml not found"),
        (["--set", "data.source=/no/such/mnist.npz"], "error: data.source: /no/such/mnist.npz does not exist"),
    ],
)
def test_preprocess_usage_errors_exit_2_with_one_line_and_no_output(workdir, args, message):
    result = invoke(preprocess, *args)
    assert result.exit_code == 2
    assert result.output.strip() == message or result.output.startswith(message)
    assert "Traceback" not in result.output
    assert not (workdir / "reports").exists() and not (workdir / "data").exists()


@pytest.mark.parametrize(("strategy", "tf_config", "message"), [
    ("multi_worker_mirrored", "{oops",
     "error: TF_CONFIG is not valid JSON (Expecting property name enclosed in double quotes at character 1)"),
    ("parameter_server", '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}',
     "error: TF_CONFIG: parameter_server needs jobs chief, worker, ps; missing chief, ps"),
])
def test_train_refuses_a_malformed_tf_config_with_exit_2(workdir, monkeypatch, strategy, tf_config, message):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    result = invoke(train, "--strategy", strategy, "--name", "x")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == message
    assert not (workdir / "models").exists()


def test_train_refuses_mixed_float16_where_loss_scaling_is_unsupported(workdir):
    result = invoke(train, "--strategy", "central_storage", "--name", "x", "--set", "train.precision=mixed_float16")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith("error: train.precision mixed_float16 needs loss scaling")


def test_train_without_prepared_data_exits_2(workdir):
    result = invoke(train, "--name", "normal")
    assert result.exit_code == 2
    assert "data/prepared/spec.json not found; run the preprocess stage (dvc repro preprocess)" in result.output


def test_train_evaluate_compare(workdir, prepared_copy):
    for name, strategy in (("normal", "default"), ("mirrored", "mirrored")):
        result = invoke(train, "--strategy", strategy, "--name", name, "--set", "mlflow.log_models=true",
                        "--set", "mlflow.register_models=true")
        assert result.exit_code == 0, result.output
    result = invoke(evaluate)  # every run params.yaml lists: normal and mirrored
    assert result.exit_code == 0, result.output
    assert "normal: test accuracy" in result.output and "mirrored: test accuracy" in result.output

    report = json.loads((workdir / "reports" / "train" / "mirrored.json").read_text())
    assert report["replicas"] == SPLIT_REPLICAS and report["global_batch_size"] == 32 * SPLIT_REPLICAS
    assert report["val_accuracy"] > 0.8
    assert report["threads"]["onednn"] is False, "runtime.onednn auto: off for the mlp, as TensorFlow reports"
    assert (workdir / "models" / "mirrored" / "MLmodel").is_file()
    history = (workdir / "reports" / "train" / "history" / "mirrored.csv").read_text().splitlines()
    assert history[0].startswith("epoch,loss,accuracy,val_loss,val_accuracy") and len(history) == 3
    evaluation = json.loads((workdir / "reports" / "eval" / "mirrored.json").read_text())
    assert evaluation["accuracy"] > 0.8 and evaluation["samples"] == 1000
    confusion = (workdir / "reports" / "eval" / "confusion" / "mirrored.csv").read_text().splitlines()
    assert confusion[0] == "actual,predicted" and len(confusion) == 1001

    # the store, the logged models and the backups: another local user opens none of them
    for kept in (workdir / "mlruns" / "mlflow.db", next((workdir / "mlruns").rglob("MLmodel")),
                 workdir / ".tfdist" / "backups"):
        assert not readable_by_others(kept), f"{kept} is readable by another local user"

    run = mlflow.get_run(report["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.params["strategy.replicas"] == str(SPLIT_REPLICAS)
    assert run.data.metrics["test_accuracy"] == pytest.approx(evaluation["accuracy"])
    assert mlflow.search_logged_models(experiment_ids=[run.info.experiment_id]).shape[0] == 2
    versions = mlflow.MlflowClient().search_model_versions("name = 'tfdist-mnist-classifier'")
    assert sorted((v.tags["strategy"], v.tags["run_name"], v.run_id == run.info.run_id) for v in versions) == [
        ("default", "normal", False), ("mirrored", "mirrored", True)]

    result = invoke(compare, "--set", "mlflow.log_models=true", "--set", "mlflow.register_models=true")
    assert result.exit_code == 0, result.output
    out = workdir / "reports" / "compare"
    assert re.search(r"^(Distribution paid off: |Distribution did not pay off on this hardware: |Within noise: )",
                     result.output, re.M), \
        "a verdict, whichever the machine gave (a loaded one can leave it within noise)"
    assert "With more machines: No run all-reduced across workers" in result.output, "mirrored is one machine's"
    cpus = len(usable_cpus())
    # auto: one thread an op and no oneDNN for the MLP. These stages run in this test's process, whose TensorFlow
    # may have started before (an earlier test on this xdist worker): then its thread pools were TensorFlow's.
    given = rf"{cpus} CPUs?, (1 thread|TensorFlow's threads) per op, oneDNN off"
    row = (rf"\| mirrored \| mirrored \| fit \| float32 \| sync \| {SPLIT_REPLICAS} \| {32 * SPLIT_REPLICAS} \| [^|]+ "
           rf"\| 1 \| {given} \|")
    assert re.search(row, (out / "compare.md").read_text()), row
    assert json.loads((out / "compare.json").read_text())["runs"]["normal"]["vs_normal"]["speedup"] == 1.0
    assert sorted(p.name for p in (out / "figures").iterdir()) == [
        "accuracy_vs_time.png", "loss_curves.png", "throughput.png", "time_to_accuracy.png"], "no projection: mirrored only"
    assert sorted(p.name for p in out.iterdir()) == [
        "compare.html", "compare.json", "compare.md", "curves.csv", "figures", "metrics.json"]
    with open("reports/train/history/normal.csv") as history:
        first_epoch = round(float(next(csv.DictReader(history))["epoch_seconds"]), 4)
    assert (out / "curves.csv").read_text().splitlines()[:2] == [
        "run,epoch,loss,accuracy,val_loss,val_accuracy,training_seconds", f"normal,1,{history_row('normal')},{first_epoch}"]
    # One parent run per execution holds the comparison; the training runs are its children.
    (parent,) = mlflow.search_runs(filter_string="tags.`tfdist.role` = 'execution'", output_format="list")
    assert parent.info.status == "FINISHED" and parent.data.tags["compared"] == "normal,mirrored"
    assert sorted(parent.data.metrics) == ["best_speedup", "best_test_accuracy", "runs_compared"]
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(parent.info.run_id)}
    assert {"compare.html", "compare.json", "compare.md", "figures"} <= artifacts
    children = mlflow.search_runs(filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'", output_format="list")
    assert sorted(child.data.tags["model_name"] for child in children) == ["mirrored", "normal"]
    assert all(child.info.status == "FINISHED" for child in children)
    # system metrics sampled while training, and the mean CPU use in the report
    assert "system/cpu_utilization_percentage" in run.data.metrics
    assert 0 < report["cpu_percent"] <= 100
    assert "| CPU use |" in (out / "compare.md").read_text()
    # the champion: the best test accuracy (ties to speed) loads by alias
    best = max(children, key=lambda child: (child.data.metrics["test_accuracy"], child.data.metrics["samples_per_second"]))
    champion = mlflow.MlflowClient().get_model_version_by_alias("tfdist-mnist-classifier", "champion")
    assert champion.run_id == best.info.run_id
    assert mlflow.pyfunc.load_model("models:/tfdist-mnist-classifier@champion").metadata.run_id == best.info.run_id


def test_compare_names_a_missing_report(workdir):
    result = invoke(compare)
    assert result.exit_code == 2 and "reports/train/normal.json not found; run the stages" in result.output


def test_train_help_names_every_strategy_of_the_registry_and_the_run_name_rule():
    from tfdist.distribute.registry import REGISTRY

    result = invoke(train, "--help")
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert all(name in text for name in REGISTRY)
    assert "letters, digits, _ . -" in text and "run as the task TF_CONFIG names" in text


def history_row(name):
    """The first epoch's loss..val_accuracy as the train stage wrote them."""
    return ",".join(Path(f"reports/train/history/{name}.csv").read_text().splitlines()[1].split(",")[1:5])


def test_a_stage_process_ends_with_its_exit_code_after_its_exit_handlers_without_teardown(tmp_path):
    """run_stage: atexit handlers registered by the stage run, then the process ends with the command's code."""
    script = tmp_path / "stage.py"
    script.write_text(
        "import atexit, sys, click\n"
        "from tfdist_cli.contract import run_stage\n"
        "@click.command()\n@click.option('--code', type=int)\n"
        "def main(code):\n"
        "    atexit.register(lambda: print('handler ran', flush=True))\n"
        "    print('stage ran')\n"
        "    if code == 99:\n        raise RuntimeError('a bug')\n"
        "    sys.exit(code)\n"
        "class Teardown:\n"
        "    def __del__(self):\n        print('torn down', flush=True)\n"
        "kept = Teardown()\n"  # a module global: collected in the interpreter's teardown, which is skipped
        "run_stage(main)\n"
    )
    for code, expected in ((0, 0), (2, 2), (99, 1)):
        result = subprocess.run([sys.executable, str(script), "--code", str(code)], capture_output=True, text=True,
                                timeout=60, cwd=Path(__file__).parents[2])
        assert result.returncode == expected, result.stderr
        assert result.stdout.splitlines() == ["stage ran", "handler ran"], result.stdout
    assert "RuntimeError: a bug" in result.stderr, "an uncaught error still prints its traceback"


def test_sigterm_while_a_stage_logs_still_stops_it(tmp_path):
    """The SIGTERM handler's Interrupted is no Exception: logging's emit, where it may land, cannot swallow it."""
    script = tmp_path / "stage.py"
    script.write_text(
        "import logging, os, signal, time, click\n"
        "from tfdist_cli.contract import stage_errors\n"
        "class Terminating:\n"  # a stream whose first write is where SIGTERM lands
        "    sent = False\n"
        "    def write(self, text):\n"
        "        if not Terminating.sent:\n"
        "            Terminating.sent = True\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "    def flush(self):\n        pass\n"
        "@click.command()\n"
        "def main():\n"
        "    with stage_errors():\n"
        "        logging.getLogger().addHandler(logging.StreamHandler(Terminating()))\n"
        "        logging.getLogger('waiting').warning('waiting for worker-1')\n"
        "        time.sleep(30)\n"
        "main()\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).parents[2])
    assert result.returncode == 128 + 15, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "error: interrupted by SIGTERM"
    assert "Logging error" not in result.stderr
