"""Shared fixtures: a tiny offline config, prepared sample data, a temp MLflow store.

TensorFlow can split the CPU into logical devices only before its first op,
so this process is given 2 logical CPUs once, up front: Mirrored and
CentralStorage tests get 2 replicas, everything else uses /cpu:0. On a
machine with GPUs the replicas are the GPUs: tests that count logical CPUs
carry ``cpu_only``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright

from tfdist.hardware import Hardware
from tfdist.reports import EvalReport, PrecisionSupport, TrainReport
from tfdist.runtime import tf
from tfdist.strategies import configure_cpu_devices

REPO = Path(__file__).resolve().parents[1]
LOGICAL_CPUS = 2
configure_cpu_devices(LOGICAL_CPUS)
HAS_GPU = bool(tf.config.list_physical_devices("GPU"))
#: Replicas of mirrored and central_storage here: one per GPU, else one per logical CPU.
SPLIT_REPLICAS = len(tf.config.list_physical_devices("GPU")) or LOGICAL_CPUS


def default_labels() -> dict[str, str]:
    """The MLflow run names of the default pipeline's runs on this machine."""
    from tfdist.reports import run_label

    split = {"replicas": SPLIT_REPLICAS, "workers": 1, "ps": 0}
    scale = {"normal": {"replicas": 1, "workers": 1, "ps": 0}, "mirrored": split, "central_storage": split,
             "multi_worker_mirrored": {"replicas": 2, "workers": 2, "ps": 0},
             "parameter_server": {"replicas": 1, "workers": 2, "ps": 1}}
    return {name: run_label(name, "default" if name == "normal" else name, loop="fit", precision="float32",
                            distributes=name != "normal", **counts) for name, counts in scale.items()}
#: For tests of the logical-CPU split, which tfdist makes only where there is no GPU.
cpu_only = pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU: replicas run on it, not on logical CPUs")


def process_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def train_stage_command(workdir: Path, strategy: str, name: str | None = None, *sets: str) -> list[str]:
    """The train stage as a subprocess command, every path (params, data, outputs, backups) under ``workdir``."""
    return [
        sys.executable, "-m", "stages.train", "--params", str(workdir / "params.yaml"), "--strategy", strategy,
        "--name", name or strategy, "--data", str(workdir / "data" / "prepared"), "--models", str(workdir / "models"),
        "--reports", str(workdir / "reports"), "--backups", str(workdir / "backups"),
        *(arg for item in sets for arg in ("--set", item)),
    ]


def copy_project(root: Path, **sections: dict) -> Path:
    """The repo's tracked files copied into ``root`` as a fresh git repo with one commit, params updated.

    What a user gets from ``git clone``: no dvc.lock, no reports, no store.
    ``sections`` update params.yaml (e.g. ``train={"epochs": 2}``).
    """
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file() and not name.startswith(("reports/", "dvc.lock")):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    template = REPO / "vega" / "offline.html"  # built by make install, not tracked
    if template.is_file():
        shutil.copy2(template, root / "vega" / "offline.html")
    params = yaml.safe_load((root / "params.yaml").read_text())
    for key, value in sections.items():
        params[key] = {**params[key], **value} if isinstance(value, dict) else value
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    git = ["git", "-c", "user.name=tfdist tests", "-c", "user.email=tests@tfdist.invalid"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy of the repo"]):
        subprocess.run([*git, *command], cwd=root, check=True, capture_output=True)
    return root


def free_ports(count: int = 1) -> list[int]:
    """``count`` distinct loopback ports free right now (nothing listens on them once returned)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@contextlib.contextmanager
def serving(command: list[str], cwd: Path, url: str, env: dict[str, str] | None = None,
            timeout: float = 90) -> Iterator[subprocess.Popen]:
    """Run an MLflow server ``command`` (``make ui``, ``make server``) until its ``/health`` says OK; stop it after.

    Its output (stdout and stderr) stays readable on ``process.stdout``; a
    server that dies or does not answer within ``timeout`` fails the test with it.
    """
    env = {**local_mode_environment(), "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}",
           **(env or {})}
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.read() == b"OK":
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                pytest.fail(f"no MLflow server came up at {url}:\n{process.stdout.read()[-3000:]}")
            time.sleep(0.5)
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        process.stdout.close()


def run_in_project(command: list[str], cwd: Path, timeout: float = 900) -> str:
    """Run ``command`` in a project copy with this venv first on PATH; fail the test with its output if it fails."""
    env = {**local_mode_environment(), "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


@dataclass(frozen=True)
class PipelineRun:
    """A fresh clone after one default ``dvc repro``: where it is, what DVC printed, its MLflow execution tag."""

    root: Path
    output: str
    execution: str


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> PipelineRun:
    """The default pipeline (every strategy, 3 epochs on the offline sample) in a fresh clone, run once per session.

    Shared by the slow end-to-end and browser tests (the browser's screenshots are the
    README's). Tests that change the clone (``dvc exp run``, params edits) live at the end
    of test_pipeline_e2e.py and find the first execution's runs by its tag.
    """
    import mlflow

    root = copy_project(tmp_path_factory.mktemp("pipeline"), data={"source": "sample"}, train={"epochs": 3})
    output = run_in_project(["dvc", "repro"], root)
    mlflow.set_tracking_uri(f"sqlite:///{root}/mlruns/mlflow.db")
    (execution,) = mlflow.search_runs(experiment_names=["tfdist-mnist"], output_format="list",
                                      filter_string="tags.`tfdist.role` = 'execution'")
    return PipelineRun(root, output, execution.data.tags["tfdist.execution"])


def local_mode_environment() -> dict[str, str]:
    """This environment without TF_CONFIG, so multi-process strategies launch locally."""
    return {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}


def tiny_params(tmp_path: Path, **sections: dict) -> Path:
    """Write a params.yaml for fast offline tests (sample data, 2 epochs, temp MLflow store)."""
    params = {
        "seed": 7,
        "data": {"source": "sample", "validation_split": 0.1, "test_split": 0.2},
        "train": {"epochs": 2, "batch_size": 32, "steps_per_execution": 20},
        "distributed": {"strategies": ["mirrored"], "devices": LOGICAL_CPUS},
        "mlflow": {"tracking_uri": f"sqlite:///{tmp_path}/mlruns/mlflow.db", "experiment": "tests", "log_models": False},
    }
    for key, value in sections.items():
        params[key] = {**params.get(key, {}), **value}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    return tiny_params(tmp_path)


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample, preprocessed once per session."""
    from tfdist.config import load_config
    from tfdist.data import preprocess

    root = tmp_path_factory.mktemp("prepared")
    config = load_config(tiny_params(root))
    preprocess(config, root / "data")
    return root / "data"


@pytest.fixture
def prepared_copy(prepared_dir: Path, tmp_path: Path) -> Path:
    """A per-test copy of the prepared data, for tests that write next to it."""
    target = tmp_path / "data" / "prepared"
    shutil.copytree(prepared_dir, target)
    return target


def train_report(strategy: str, seconds: float, replicas: int = 1, devices: tuple | list = ("/cpu:0",),
                 **fields: Any) -> TrainReport:
    """A train report with every field the train stage writes (the real schema), for the readers' tests.

    ``fields`` override any field; ``precision_support`` may be given as plain dicts.
    The hardware is one 2-core machine, with GPUs when ``devices`` name them.
    """
    support = fields.pop("precision_support", {
        "mixed_float16": {"can_be_faster": False, "reason": "no GPU"},
        "mixed_bfloat16": {"can_be_faster": False, "reason": "no AVX512-BF16"}})
    kinds = ["GPU"] if any("gpu" in d for d in devices) else ["CPU"]
    values = dict(
        name=strategy if strategy != "default" else "normal", strategy=strategy,
        paradigm="none" if strategy in ("default", "one_device") else "data", strategy_class="X", replicas=replicas,
        devices=list(devices), workers=1, ps=0, synchronous=True, loop="fit", precision="float32",
        precision_can_be_faster=True,
        precision_support={p: PrecisionSupport(**s) if isinstance(s, dict) else s for p, s in support.items()},
        run_label=strategy, clip_method="none", clip_value=1.0, global_batch_size=25 * replicas, lr_scaling="none",
        base_learning_rate=0.001, learning_rate=0.001, warmup_steps=0, epochs=2, resumed_at_epoch=0,
        steps_per_epoch=100, traces={"train": 1, "test": 1}, train_seconds=seconds,
        samples_per_second=1000 / seconds, steady_epoch_seconds=seconds / 2, first_epoch_overhead_seconds=0.0,
        steady_samples_per_second=1000 / seconds, startup_seconds=5.0, cpu_percent=90.0, params_per_device=[101_770],
        bytes_per_step=0, stages=1, micro_batches=1, bubble_theory=None, bubble=None, loss=0.3, accuracy=0.9, val_loss=0.3,
        val_accuracy=0.9, weights_sha256="0" * 64, mlflow_run_id=f"id-{strategy}", tensorflow=tf.__version__,
        hardware=Hardware(["host-a"], 2, "test CPU", kinds, ["test GPU"] * (kinds == ["GPU"])),
    )
    values.update(fields)
    return TrainReport(**values)


def eval_report(name: str, accuracy: float, loss: float = 0.2) -> EvalReport:
    """An eval report as the evaluate stage writes it (per-class numbers left out)."""
    return EvalReport(name=name, loss=loss, accuracy=accuracy, samples=1000)


#: Debian's Chromium, which the browser tests drive through Playwright (nothing is downloaded).
CHROMIUM = os.environ.get("TFDIST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("TFDIST_TEST_ARTIFACTS", REPO / "test-artifacts"))
# Headless as root, and quiet: without the background-networking flags Chromium keeps
# calling Google's services, which this network refuses.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


@dataclass(frozen=True)
class DrawnPage:
    """What a page drew in a browser with networking off."""

    plots: int
    requests: list[str]
    errors: list[str]


@pytest.fixture(scope="session")
def browser() -> Any:
    """Headless Debian Chromium, driven by Playwright, for every browser test of the session."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no Chromium at {CHROMIUM}: install Debian's chromium (make browser-deps) or set TFDIST_CHROMIUM")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


def draw_offline(browser: Any, page_file: Path, screenshot: str | None = None) -> DrawnPage:
    """Open a ``dvc plots`` page in a browser context with networking off; count the Vega plots it drew."""
    context = browser.new_context(offline=True, viewport={"width": 1600, "height": 1000})
    try:
        page = context.new_page()
        requests: list[str] = []
        errors: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(page_file.as_uri())
        drawn = page.locator(".vega-embed canvas, .vega-embed svg.marks")
        try:
            drawn.first.wait_for(timeout=15_000)
            page.wait_for_timeout(500)  # the others draw in the same tick or the next
        except PlaywrightTimeout:
            pass  # nothing drew: the count says so
        if screenshot:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / screenshot))
        return DrawnPage(drawn.count(), [url for url in requests if not url.startswith("file:")], errors)
    finally:
        context.close()
