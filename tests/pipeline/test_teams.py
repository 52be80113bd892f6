"""A team's ways of running: queued and temp DVC experiments, PostgreSQL, and a tracking server in front of it.

Every DVC way of running must record into the workspace's store (DVC runs
queued and ``--temp`` experiments in throwaway copies under .dvc/tmp/exps);
two experiments at once (``dvc queue start -j 2``) each launch a 2-worker
cluster on loopback, so their ports must not collide. The PostgreSQL tests
need the local server up (``make postgres``; .ci/run does it).
"""

from __future__ import annotations

import base64
import getpass
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest

from helpers.project import copy_project, run_in_project
from helpers.servers import assert_no_job_runners, free_ports, serving

pytestmark = pytest.mark.slow
#: Small and quick, and multi-process: two at once contend for loopback ports.
PARAMS = {"data": {"source": "sample"}, "train": {"epochs": 1},
          "distributed": {"strategies": ["multi_worker_mirrored"]}, "mlflow": {"log_models": False}}
MODELS = ["multi_worker_mirrored", "normal"]
QUEUE_TIMEOUT = 900


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return copy_project(tmp_path_factory.mktemp("queue"), **PARAMS)


def queue(project: Path, experiments: dict[str, list[str]], jobs: int) -> str:
    """Queue ``experiments`` (name -> ``-S`` overrides), run them with ``jobs`` workers, wait; ``dvc queue status``."""
    for name, sets in experiments.items():
        run_in_project(["dvc", "exp", "run", "--queue", "-n", name, *(a for s in sets for a in ("-S", s))], project)
    run_in_project(["dvc", "queue", "start", "-j", str(jobs)], project)
    deadline = time.monotonic() + QUEUE_TIMEOUT
    while True:
        status = run_in_project(["dvc", "queue", "status"], project)
        rows = [line for line in status.splitlines() if any(name in line for name in experiments)]
        if rows and not any(word in line for line in rows for word in ("Queued", "Running")):
            return status
        assert time.monotonic() < deadline, f"the queue did not finish in {QUEUE_TIMEOUT} s:\n{status}"
        time.sleep(3)


def recorded(uri: str, execution: str) -> dict[str, mlflow.entities.Run]:
    """The runs of one execution in store ``uri``, by model name (``execution`` for the parent)."""
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tfdist-mnist")
    assert experiment is not None, f"no experiment tfdist-mnist in {uri}"
    runs = client.search_runs([experiment.experiment_id], f"tags.`tfdist.execution` = '{execution}'")
    return {run.data.tags.get("model_name", "execution"): run for run in runs}


def assert_recorded(uri: str, execution: str, experiment: str | None = None,
                    models: list[str] = MODELS) -> dict[str, mlflow.entities.Run]:
    """One parent and one FINISHED run per model for ``execution``, nested, tagged with the DVC experiment.

    ``experiment``: the DVC experiment's name, ``execution`` unless given ("" for ``dvc repro``).
    """
    runs = recorded(uri, execution)
    assert sorted(runs) == ["execution", *models], f"{execution}: {sorted(runs)}"
    assert {run.info.status for run in runs.values()} == {"FINISHED"}, execution
    parent = runs["execution"].info.run_id
    for model in models:
        assert runs[model].data.tags["mlflow.parentRunId"] == parent
        assert runs[model].data.tags.get("dvc.experiment", "") == (execution if experiment is None else experiment)
    return runs


def no_run_left_running(uri: str) -> None:
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tfdist-mnist")
    running = client.search_runs([experiment.experiment_id], "attributes.status = 'RUNNING'")
    assert not running, [run.info.run_name for run in running]


def workspace_store(project: Path) -> str:
    return f"sqlite:///{project}/mlruns/mlflow.db"


# --- PostgreSQL, directly and behind a tracking server ----------------------------------------------------


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh database on the local PostgreSQL, as a tracking URI; dropped afterwards."""
    if not shutil.which("createdb"):
        pytest.skip("PostgreSQL's client tools are not installed")
    name = f"tfdist_test_{uuid.uuid4().hex[:8]}"
    created = subprocess.run(["createdb", name], capture_output=True, text=True)
    assert created.returncode == 0, f"PostgreSQL is not reachable (run make postgres): {created.stderr.strip()}"
    yield f"postgresql://{getpass.getuser()}@/{name}?host=/var/run/postgresql"
    subprocess.run(["dropdb", "--force", name], capture_output=True)


def test_a_temp_experiment_records_into_postgresql_directly_and_its_artifacts_into_the_workspace(tmp_path, database):
    """``dvc exp run --temp`` runs in a throwaway copy: the runs go to the database, the artifacts to the workspace."""
    # one process per stage (mirrored): what matters here is the store and the copy, not the launcher
    project = copy_project(tmp_path, **{**PARAMS, "distributed": {"strategies": ["mirrored"]},
                                        "mlflow": {**PARAMS["mlflow"], "tracking_uri": database}})
    run_in_project(["dvc", "exp", "run", "--temp", "-n", "temp-pg", "-S", "seed=3"], project)
    runs = assert_recorded(database, "temp-pg", models=["mirrored", "normal"])
    artifacts = runs["execution"].info.artifact_uri
    assert artifacts.startswith((project / "mlruns").as_uri()), f"artifacts outside the workspace: {artifacts}"
    assert "compare.html" in {a.path for a in mlflow.MlflowClient(database).list_artifacts(
        runs["execution"].info.run_id)}
    no_run_left_running(database)


@pytest.fixture
def server(tmp_path, database) -> Iterator[tuple[str, Path]]:
    """``tfdist server`` on the database, artifacts proxied to a folder: URL, folder."""
    (port,), artifacts = free_ports(), tmp_path / "server-artifacts"
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "tfdist_cli", "server", "--backend-store-uri", database, "--port", str(port),
               "--artifacts-destination", str(artifacts), "--workers", "2"]
    with serving(command, tmp_path, url) as process:
        argv = Path(f"/proc/{process.pid}/cmdline").read_bytes().decode().split("\0")
        assert argv[argv.index("--host") + 1] == "127.0.0.1" and "--serve-artifacts" in argv
        assert_no_job_runners(process)
        yield url, artifacts


def test_two_queued_experiments_at_once_record_one_into_the_workspace_store_one_through_a_server(project, server):
    """``dvc queue start -j 2``: each experiment in its own copy, each a 2-worker cluster on loopback at once.

    One records into the workspace's sqlite store (not its copy's), the other through
    ``tfdist server`` on PostgreSQL (``-S mlflow.tracking_uri=``, as docs/teams.md shows),
    its artifacts proxied to the server's folder. (Several stages writing one new sqlite
    store at once: test_resume.)
    """
    url, artifacts = server
    names = {"q-workspace": ["seed=1"], "q-server": ["seed=2", f"mlflow.tracking_uri={url}"]}
    status = queue(project, names, jobs=2)
    assert status.count("Success") >= len(names), status

    local = assert_recorded(workspace_store(project), "q-workspace")
    parent = local["execution"].info
    assert parent.artifact_uri.startswith((project / "mlruns").as_uri()), f"artifacts outside the workspace: {parent}"
    assert "compare.html" in {a.path for a in mlflow.MlflowClient(workspace_store(project)).list_artifacts(parent.run_id)}
    assert not list((project / ".dvc" / "tmp" / "exps").rglob("mlflow.db")), "no store left in a copy"

    served = assert_recorded(url, "q-server")
    parent = served["execution"].info
    assert parent.artifact_uri.startswith("mlflow-artifacts:/"), "artifacts go through the server"
    assert "compare.html" in {a.path for a in mlflow.MlflowClient(url).list_artifacts(parent.run_id)}
    assert list(artifacts.rglob("compare.html")), "the server keeps the artifacts in --artifacts-destination"
    assert not recorded(workspace_store(project), "q-server") and not recorded(url, "q-workspace"), "each in its store"
    kept_here = {path.name for path in (project / "mlruns").rglob("*")}
    assert not kept_here & {run.info.run_id for run in served.values()}, "a client of a server keeps nothing locally"
    no_run_left_running(workspace_store(project))
    no_run_left_running(url)


def test_basic_auth_turns_away_anonymous_clients_and_serves_the_same_ui(tmp_path, database):
    (port,) = free_ports()
    env = {"MLFLOW_FLASK_SERVER_SECRET_KEY": "test-secret-key", "MLFLOW_AUTH_ADMIN_PASSWORD": "a-long-test-password-7",
           "MLFLOW_AUTH_CONFIG_PATH": str(tmp_path / "auth.ini")}
    (tmp_path / "auth.ini").write_text(
        f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{tmp_path}/auth.db\nadmin_username = admin\n"
        "admin_password = a-long-test-password-7\nauthorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "tfdist_cli", "server", "--backend-store-uri", database, "--port", str(port),
               "--artifacts-destination", str(tmp_path / "artifacts"), "--workers", "1", "--auth"]
    # A request waits for the one worker to check a password hash, slow CPU work: on a machine loaded
    # by the other half of the suite one took over 10 s, so each gets a loaded machine's room.
    wait = 60
    with serving(command, tmp_path, url, env):
        search = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(search, timeout=wait)
        assert refused.value.code == 401
        request = urllib.request.Request(search, headers={"Authorization": "Basic " + base64.b64encode(
            b"admin:a-long-test-password-7").decode()})
        with urllib.request.urlopen(request, timeout=wait) as response:
            assert response.status == 200
        with urllib.request.urlopen(urllib.request.Request(url + "/", headers=request.headers), timeout=wait) as page:
            assert "mlflow.workflowType_v1" in page.read().decode()


def test_the_server_refuses_auth_without_its_secrets_and_names_them(tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    result = subprocess.run([sys.executable, "-m", "tfdist_cli", "server", "--auth", "--backend-store-uri",
                             f"sqlite:///{tmp_path}/store.db"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --auth needs MLFLOW_FLASK_SERVER_SECRET_KEY and MLFLOW_AUTH_ADMIN_PASSWORD in the environment "
        "(see docs/teams.md)")
