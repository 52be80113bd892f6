"""The ``tfdist`` command: one group, a subcommand per operator tool, each with --help and the stage contract's exit codes."""

import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tfdist_cli.main import cli

from helpers.project import REPO, tiny_params

SUBCOMMANDS = ("ui", "server", "s3", "push", "pull", "status", "experiments", "plots")


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="tfdist")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny_params(tmp_path)
    return tmp_path


def test_the_group_lists_every_subcommand_and_each_has_help():
    listing = invoke("--help")
    assert listing.exit_code == 0, listing.output
    for name in SUBCOMMANDS:
        assert f"  {name} " in listing.output, f"tfdist --help does not list {name}"
        help_text = invoke(name, "--help")
        assert help_text.exit_code == 0 and f"Usage: tfdist {name}" in help_text.output, help_text.output
        assert len(help_text.output.splitlines()) > 3, f"tfdist {name} --help explains nothing"


def test_the_console_script_runs_the_group():
    """``tfdist`` (pyproject's console script) and ``python -m tfdist_cli`` are the same command."""
    script = REPO / ".venv" / "bin" / "tfdist"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "tfdist_cli"]
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "experiments" in result.stdout, result.stderr
    bad = subprocess.run([*command, "nonsense"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "No such command 'nonsense'" in bad.stderr


def test_the_stages_folder_holds_only_what_dvc_runs():
    import yaml

    run = {word.split("/")[1] for stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].values()
           for word in stage["cmd"].split() if word.startswith("stages/")}
    assert {p.name for p in (REPO / "stages").glob("*.py")} - {"__init__.py"} == run


def test_ui_needs_a_store_and_a_free_port(workdir):
    result = invoke("ui")
    assert result.exit_code == 2
    assert "mlflow.tracking_uri sqlite:///" in result.output and "no store there yet; run the pipeline first" in result.output

    from tfdist.config.params import load_config
    from tfdist.tracking import experiment

    experiment.configure(load_config(workdir / "params.yaml").mlflow)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke("ui", "--port", port)
    assert result.exit_code == 2 and f"cannot serve on 127.0.0.1:{port}" in result.output
    assert "pass another --port" in result.output


def _shown(name, params, metrics):
    return {"rev": name, "name": None, "data": {"params": {"params.yaml": {"data": params}},
                                                "metrics": {"reports/compare/metrics.json": {"data": metrics}}}}


def test_experiments_fit_a_120_column_terminal_with_runs_as_rows_and_what_changed_named():
    from tfdist_cli.experiments import compact_view

    runs = {f"strategy_with_a_rather_long_name_{i}": {"samples_per_second": 12345.6, "speedup": 0.5, "test_accuracy": 0.9,
                                                       "seconds_to_target": None, "time_to_accuracy_speedup": None}
            for i in range(3)}
    params = {"train": {"epochs": 10, "batch_size": 25}, "mlflow": {"outage_timeout": 120}}
    shown = [_shown("workspace", params, runs)]
    shown[0]["experiments"] = [{"name": "big-batch", "revs": [{"rev": "a" * 40, "name": "big-batch", "data": _shown(
        "x", {"train": {"epochs": 10, "batch_size": 256}, "mlflow": {"outage_timeout": 5}}, runs)["data"]}]}]
    view = compact_view(shown, width=120)
    lines = view.splitlines()
    assert max(len(line) for line in lines) <= 120, max(lines, key=len)
    assert "workspace: the workspace's params" in lines
    assert "big-batch: train.batch_size=256" in lines, "a result knob that changed, and not an operational one"
    assert any(line.strip().startswith("strategy_with_a_rather_long_name_0") and "12,346" in line and "0.50x" in line
               and line.rstrip().endswith("–") for line in lines)
    assert all(len(line) <= 60 for line in compact_view(shown, width=60).splitlines())


def test_a_flag_that_would_open_a_door_to_others_is_refused_in_one_line(workdir):
    from tfdist.config.params import load_config
    from tfdist.tracking import experiment

    experiment.configure(load_config(workdir / "params.yaml").mlflow)
    published = invoke("ui", "--host", "0.0.0.0", "--enable", "assistant")
    assert published.exit_code == 2 and "--enable assistant needs a loopback --host" in published.output
    wildcard = invoke("ui", "--cors-origin", "*")
    assert wildcard.exit_code == 2 and "--cors-origin *: name one page" in wildcard.output
    for option in ("--gunicorn-opts=-w 4", "--allowed-hosts", "--disable-security-middleware"):
        refused = invoke("server", "--backend-store-uri", f"sqlite:///{workdir}/team.db", "--", option)
        assert refused.exit_code == 2 and f"{option} after --" in refused.output, refused.output
