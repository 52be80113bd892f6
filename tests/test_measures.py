"""One record, every view: a measured number declared once on the train report reaches MLflow, compare.json,
metrics.json and the report's tables, and an older report without it still loads and shows a dash."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import pytest

from tfdist.compare.comparison import headline_metrics, to_json
from tfdist.compare.compute import build_comparison
from tfdist.compare.render import render_markdown
from tfdist.records import reports
from tfdist.records.measures import Ratio, measure, mlflow_metrics, ratio
from tfdist.records.reports import TrainReport, read_report, write_report

from helpers.reports import eval_report, train_report


@dataclass(frozen=True)
class WithWait(TrainReport):
    """The train report with one more measured number, as a newcomer would add it: one field, its metadata."""

    peer_wait_ms: float | None = field(default=None, metadata=measure(
        mlflow="peer_wait_ms", table="results", heading="waiting for peers (ms)", format="{:.2f}", better="lower",
        headline="peer_wait_ms", ratio=Ratio("wait_vs_normal", "waiting vs normal")))


def with_wait(strategy: str, seconds: float, wait: float | None, *args, **fields) -> WithWait:
    base = train_report(strategy, seconds, *args, **fields)
    return WithWait(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)}, peer_wait_ms=wait)


def test_a_field_added_to_the_record_reaches_mlflow_compare_json_metrics_json_and_the_table():
    normal, mirrored = with_wait("default", 10.0, 2.0), with_wait("mirrored", 8.0, 0.5, 2, ["/cpu:0", "/cpu:1"])
    assert mlflow_metrics(mirrored)["peer_wait_ms"] == 0.5

    comparison = build_comparison({"normal": normal, "mirrored": mirrored},
                                  {name: eval_report(name, 0.95) for name in ("normal", "mirrored")})
    written = json.loads(json.dumps(to_json(comparison)))
    assert written["runs"]["mirrored"]["report"]["peer_wait_ms"] == 0.5
    assert written["runs"]["mirrored"]["vs_normal"]["wait_vs_normal"] == pytest.approx(4.0), "lower is better: 2.0 / 0.5"
    assert headline_metrics(comparison.runs["mirrored"])["peer_wait_ms"] == 0.5

    markdown = render_markdown(comparison)
    header = next(line for line in markdown.splitlines() if "waiting for peers (ms)" in line)
    cells = [cell.strip() for cell in header.strip("|").split("|")]
    row = next(line for line in markdown.splitlines() if line.startswith("| mirrored | 125 |"))
    values = [cell.strip() for cell in row.strip("|").split("|")]
    assert values[cells.index("waiting for peers (ms)")] == "0.50"
    assert values[cells.index("waiting vs normal")] == "4.00x"


def test_an_older_report_without_the_new_field_loads_and_shows_a_dash(tmp_path):
    old = train_report("default", 10.0)
    write_report(tmp_path / "normal.json", old)  # written before the field existed
    loaded = read_report(tmp_path / "normal.json", WithWait)
    assert loaded.peer_wait_ms is None and "peer_wait_ms" not in mlflow_metrics(loaded)

    newer = with_wait("mirrored", 8.0, 0.5, 2, ["/cpu:0", "/cpu:1"])
    comparison = build_comparison({"normal": loaded, "mirrored": newer},
                                  {name: eval_report(name, 0.95) for name in ("normal", "mirrored")})
    normal_row = next(line for line in render_markdown(comparison).splitlines() if line.startswith("| normal | 100 |"))
    assert "| – |" in normal_row
    assert comparison.runs["mirrored"].vs_normal["wait_vs_normal"] is None, "nothing to set it against"


def test_the_train_reports_metrics_are_its_declared_fields_scaled_nested_records_included():
    costs = reports.CollectiveCosts(workers=2, small_bytes=4, small_seconds=1e-3, large_bytes=400, large_seconds=2e-3,
                                    latency_seconds=1e-3, seconds_per_byte=2e-9)
    report = train_report("multi_worker_mirrored", 10.0, 2, collectives=costs, params_per_device=[7, 9], bubble=None)
    metrics = mlflow_metrics(report)
    assert metrics["allreduce_latency_ms"] == pytest.approx(1.0) and metrics["allreduce_ns_per_byte"] == pytest.approx(2.0)
    assert metrics["max_params_per_device"] == 9 and metrics["train_function_traces"] == 1
    assert metrics["effective_learning_rate"] == report.learning_rate
    assert "bubble" not in metrics, "a number a run does not have is not logged"
    assert "weights_sha256" not in metrics and "replicas" not in metrics, "settings are params, not metrics"


@pytest.mark.parametrize(("better", "value", "normal", "expected"), [
    ("lower", 5.0, 10.0, 2.0), ("higher", 5.0, 10.0, 0.5), ("lower", None, 10.0, None), ("higher", 0.0, 10.0, None)])
def test_a_ratio_is_above_one_when_the_run_beats_normal_training(better, value, normal, expected):
    assert ratio(measure(better=better)["measure"], value, normal) == expected
