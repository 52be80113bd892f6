"""The comparison as a user sees it, in headless Chromium: the MLflow UI on a pipeline's store, and the HTML report.

Needs Debian's ``chromium`` (``make browser-deps`` installs it; CI does). Playwright
drives that executable, so no browser is downloaded. Screenshots land in
``test-artifacts/`` (or ``$TFDIST_TEST_ARTIFACTS``) for a person to look at.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest

from helpers.browser import ARTIFACTS, draw_offline
from helpers.project import run_in_project
from helpers.reports import default_labels
from helpers.servers import assert_no_job_runners, free_ports, serving

pytestmark = pytest.mark.slow
LABELS = default_labels()


@pytest.fixture(scope="module")
def project(pipeline):
    """The shared default pipeline (conftest.pipeline): its screenshots are the README's (docs/images/)."""
    return pipeline.root


@pytest.fixture(scope="module")
def runs(project, pipeline):
    """That execution's runs by model name (``execution`` for its parent run, which holds the comparison)."""
    mlflow.set_tracking_uri(f"sqlite:///{project}/mlruns/mlflow.db")
    found = mlflow.search_runs(experiment_names=["tfdist-mnist"], output_format="list",
                               filter_string=f"tags.`tfdist.execution` = '{pipeline.execution}'")
    return {run.data.tags.get("model_name", "execution"): run for run in found}


@dataclass(frozen=True)
class UI:
    """The served UI: its base URL, the server process, and the address of the newest training runs it printed."""

    url: str
    server: subprocess.Popen
    printed: str


@pytest.fixture(scope="module")
def ui(project):
    """``tfdist ui`` serving the project's store on a free port."""
    (port,) = free_ports()
    url = f"http://127.0.0.1:{port}"
    with serving([sys.executable, "-m", "tfdist_cli", "ui", "--port", str(port)], project, url) as server:
        printed = server.output().splitlines(keepends=True)[:2]  # printed before mlflow started
        yield UI(url, server, printed[1].strip())


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1700, "height": 1000})
    yield context.new_page()
    context.close()


def shoot(page, name: str, full_page: bool = False) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=full_page)


def close_assistant(page) -> None:
    """The UI opens an assistant side panel; closing it gives the runs table the width."""
    close = page.locator("button[aria-label='Close']")
    if close.count():
        close.first.click()


def expand_execution(page, execution: str) -> None:
    """Open an execution's row in the runs table: its stage runs are nested under it."""
    page.get_by_text(execution, exact=True).first.wait_for(timeout=30_000)
    close_assistant(page)
    page.locator("[role=row]", has_text=execution).first.locator("button.du-bois-light-btn-link").first.click()


def show_chart(page, metric: str) -> None:
    """Find ``metric``'s chart with the chart view's search box (charts render as they scroll into view)."""
    search = page.get_by_placeholder("Search metric charts")
    search.fill(metric)
    page.get_by_text(metric, exact=True).first.wait_for(timeout=30_000)
    search.fill("")


def add_metric_column(page, metric: str) -> None:
    """Columns -> search -> tick ``metric``."""
    page.get_by_role("button", name="Columns", exact=True).click()
    page.get_by_placeholder("Search columns").fill(metric)
    page.locator(f"xpath=//span[normalize-space(.)='{metric}']").last.click()
    page.keyboard.press("Escape")
    page.locator(f"[role=columnheader][col-id='metrics.`{metric}`']").wait_for(timeout=15_000)


def test_the_ui_command_serves_the_workspace_store_on_loopback_and_prints_the_newest_runs(ui, project, pipeline, runs):
    command = Path(f"/proc/{ui.server.pid}/cmdline").read_bytes().decode().split("\0")
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert "--backend-store-uri" not in command, "the store reaches the server in its environment, not argv"
    environ = Path(f"/proc/{ui.server.pid}/environ").read_bytes().split(b"\0")
    assert f"MLFLOW_BACKEND_STORE_URI=sqlite:///{project}/mlruns/mlflow.db".encode() in environ
    assert command[command.index("--app-name") + 1] == "tfdist"
    assert_no_job_runners(ui.server)
    experiment_id = runs["normal"].info.experiment_id
    assert ui.printed.startswith(f"{ui.url}/#/experiments/{experiment_id}/runs?workflowType=machine_learning")
    query = urllib.parse.parse_qs(ui.printed.split("?", 1)[1])
    assert query["compareRunsMode"] == ["CHART"]
    assert query["searchFilter"] == [f"tags.`tfdist.execution` = '{pipeline.execution}' and tags.stage = 'train'"]


def test_from_the_home_page_the_experiment_opens_on_its_runs_and_the_training_curves(ui, runs, page):
    """What a new user does: open the UI, click the experiment, open the execution, look at the charts."""
    page.goto(ui.url)
    page.get_by_role("link", name="tfdist-mnist").first.click()
    execution = runs["execution"].info.run_name
    page.get_by_text(execution, exact=True).first.wait_for(timeout=30_000)
    assert "/runs" in page.url and "workflowType=machine_learning" in page.url, page.url
    assert page.get_by_text("Detect issues").count() == 0, "not MLflow's GenAI overview"
    expand_execution(page, execution)
    for label in LABELS.values():
        page.get_by_text(label, exact=True).first.wait_for(timeout=15_000)
    shoot(page, "mlflow-home-to-runs.png")
    page.locator("label:has(input[name=runs-view-mode][value=CHART])").click()
    for chart in ("val_accuracy", "samples_per_second"):
        show_chart(page, chart)


def test_the_printed_address_charts_the_executions_training_runs_not_the_comparison(ui, runs, page):
    page.goto(ui.printed)
    for label in LABELS.values():
        page.get_by_text(label, exact=True).first.wait_for(timeout=30_000)
    close_assistant(page)
    page.get_by_text("Model metrics", exact=False).first.wait_for(timeout=30_000)
    body = page.inner_text("body")
    assert f"{len(LABELS)} matching runs" in body
    assert "best_speedup" not in body and "normal.speedup" not in body, "the comparison's numbers do not flood the charts"
    assert "System metrics" in body, "CPU and memory over time"
    shoot(page, "mlflow-charts.png")
    show_chart(page, "val_accuracy")


def test_the_experiment_lists_this_executions_runs_with_a_metric_column(ui, runs, page):
    url = ui.url
    execution = runs["normal"].data.tags["tfdist.execution"]
    assert {run.data.tags["tfdist.execution"] for run in runs.values()} == {execution}
    search = urllib.parse.quote(f"tags.`tfdist.execution` = '{execution}' and tags.stage = 'train'")
    experiment_id = runs["normal"].info.experiment_id
    page.goto(f"{url}/#/experiments/{experiment_id}/runs?workflowType=machine_learning&searchFilter={search}")
    expand_execution(page, runs["execution"].info.run_name)
    for label in LABELS.values():
        page.get_by_text(label, exact=True).first.wait_for(timeout=30_000)

    for metric in ("test_accuracy", "steady_samples_per_second"):
        add_metric_column(page, metric)
    shown = []
    for cell in page.get_by_role("gridcell").all_inner_texts():
        try:
            shown.append(float(cell))
        except ValueError:
            continue
    for name in LABELS:
        accuracy = runs[name].data.metrics["test_accuracy"]
        assert any(abs(value - accuracy) < 5e-4 for value in shown), f"{name}'s {accuracy} is not among {shown}"
    assert f"{len(LABELS) + 1} matching runs" in page.inner_text("body"), "the training runs and their parent"
    page.set_viewport_size({"width": 1700, "height": 640})  # the table, not the empty page below it
    shoot(page, "mlflow-runs.png")


def test_a_training_run_page_shows_its_params_dataset_and_model(ui, project, runs, page):
    url = ui.url
    run = runs["mirrored"]
    page.goto(f"{url}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}?workflowType=machine_learning")
    page.get_by_text(LABELS["mirrored"], exact=True).first.wait_for(timeout=30_000)
    close_assistant(page)
    for text in ("train.epochs", "strategy.replicas", "Logged models (1)", "tfdist.execution"):
        page.get_by_text(text, exact=True).first.wait_for(timeout=15_000)
    data = json.loads((project / "reports" / "data.json").read_text())
    page.get_by_text(f"{data['source']} ({data['sha256'][:16]})").first.wait_for(timeout=15_000)  # MNIST sample (...)
    shoot(page, "mlflow-run.png", full_page=True)

    page.get_by_role("tab", name="Artifacts").click()
    page.get_by_text("MLmodel", exact=True).first.wait_for(timeout=15_000)
    shoot(page, "mlflow-run-artifacts.png")


def test_the_html_report_renders_without_fetching_anything(project, page):
    report = project / "reports" / "compare" / "compare.html"
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(report.as_uri())
    assert page.locator("h2", has_text="Advice").is_visible()
    assert page.locator("table").count() == 4  # scaling projection, runs, results, what each holds and moves
    widths = page.eval_on_selector_all("img", "images => images.map(image => image.complete && image.naturalWidth)")
    assert len(widths) == 5 and all(width > 0 for width in widths), widths  # time to accuracy ... projection
    assert [url for url in requests if not url.startswith("data:")] == [report.as_uri()], requests
    shoot(page, "compare-report.png", full_page=True)


def test_dvc_plots_draw_every_plot_with_the_network_off(project, browser):
    run_in_project(["dvc", "plots", "show", "-o", "offline-plots"], project)
    page = project / "offline-plots" / "index.html"
    assert "cdn.jsdelivr" not in page.read_text(), "the page must not load Vega from a CDN"
    drawn = draw_offline(browser, page, screenshot="dvc-plots.png")
    assert drawn.errors == [] and drawn.requests == []
    assert drawn.plots == 5 + len(LABELS), "time to accuracy, 4 per-epoch curve plots and a confusion matrix per run"
