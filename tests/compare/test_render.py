"""The comparison laid out: markdown, figures, and one self-contained HTML page that fetches nothing."""

import html
import re

from tfdist.compare.compute import build_comparison
from tfdist.compare.render import plot_figures, render_html, render_markdown
from tfdist.records.reports import ThreadSettings

from helpers.reports import eval_report, scaled_runs, train_report


def history():
    return [{"epoch": 1, "loss": 0.5, "val_loss": 0.6, "val_accuracy": 0.90, "epoch_seconds": 2.0},
            {"epoch": 2, "loss": 0.3, "val_loss": 0.4, "val_accuracy": 0.94, "epoch_seconds": 1.0}]


def test_markdown_and_figures(tmp_path):
    comparison = build_comparison(
        {"normal": train_report("default", 10.0), "central_storage": train_report("central_storage", 9.5, 2, input_share=None)},
        {"normal": eval_report("normal", 0.95, 0.2), "central_storage": eval_report("central_storage", 0.951, 0.2)},
    )
    markdown = render_markdown(comparison)
    assert ("| central_storage | central_storage | fit | float32 | sync | 2 | 50 | 0.001 | 1 | 2 CPUs, 1 thread per op |"
            in markdown)
    # no histories given: no time to accuracy
    assert ("| central_storage | 105 | 4.750 | 1.05x | 0.00 | 9.5 | 90% | – | 0.9510 | not reached | not reached | not reached "
            "| +0.10 |") in markdown
    assert "Asynchronous" not in markdown
    # no histories, so no interval: within 10 % of 1.0 is taken for noise
    assert "Within noise: the fastest strategy, central_storage, ran at 1.05x the speed of normal training" in markdown
    paths = plot_figures(comparison, {"normal": history(), "central_storage": history()}, tmp_path / "figures")
    assert [p.name for p in paths] == ["time_to_accuracy.png", "throughput.png", "accuracy_vs_time.png", "loss_curves.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)


def test_the_setup_says_what_each_run_was_given_pinned_workers_one_cpu_each_and_onednn():
    threads = ThreadSettings(cpus=1, intra_op=1, inter_op=1, onednn=False)
    comparison = build_comparison(
        {"normal": train_report("default", 10.0, threads=ThreadSettings(cpus=2, intra_op=2, inter_op=2, onednn=True)),
         "multi_worker_mirrored": train_report("multi_worker_mirrored", 9.0, 2, workers=2, threads=threads),
         "old": train_report("mirrored", 9.0, 2, name="old", threads=None)},
        {name: eval_report(name, 0.95) for name in ("normal", "multi_worker_mirrored", "old")},
    )
    markdown = render_markdown(comparison)
    assert "| CPUs, threads |" in markdown
    assert "| normal | default | fit | float32 | sync | 1 | 25 | 0.001 | 1 | 2 CPUs, 2 threads per op, oneDNN on |" in markdown
    assert ("| multi_worker_mirrored | multi_worker_mirrored | fit | float32 | sync | 2 | 50 | 0.001 | 2 | 2 x 1 CPU, "
            "1 thread per op, oneDNN off |" in markdown)
    assert "| old | mirrored | fit | float32 | sync | 2 | 50 | 0.001 | 1 | not recorded |" in markdown


def test_html_page_has_the_markdown_content_and_fetches_nothing(tmp_path):
    comparison = scaled_runs(mirrored_sps=800.0)
    plot_figures(comparison, {name: history() for name in comparison.runs}, tmp_path / "figures")
    page = render_html(comparison, tmp_path)
    markdown = render_markdown(comparison)
    assert page.startswith("<!DOCTYPE html>") and page.count('<img src="data:image/png;base64,') == 4
    references = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", page)
    assert len(references) == 4 and all(ref.startswith("data:image/png;base64,") for ref in references)
    assert "@import" not in page and "url(" not in page
    for heading in re.findall(r"^##? (.+)$", markdown, re.M):
        assert f">{html.escape(heading)}</h" in page
    assert "<td>mirrored</td>" in page and "Train without distribution" in page
    assert "<strong>Here:</strong>" in page and "<code>dvc exp run -S train.precision=mixed_bfloat16" in page


def test_a_projected_run_gets_its_speed_up_figure_and_the_report_shows_it(tmp_path):
    from helpers.reports import eval_report as evaluation

    comparison = build_comparison(*_projected_runs(evaluation))
    assert comparison.scaling, "multi_worker_mirrored all-reduced across workers: it is projected"
    paths = plot_figures(comparison, {name: history() for name in comparison.runs}, tmp_path / "figures")
    assert [p.name for p in paths][-1] == "projection.png"
    assert "![Projected speed-up against machines, break-even marked](figures/projection.png)" in render_markdown(comparison)
    assert render_html(comparison, tmp_path).count('<img src="data:image/png;base64,') == 5


def _projected_runs(evaluation):
    from tfdist.records.reports import CollectiveCosts

    costs = CollectiveCosts(workers=2, small_bytes=4, small_seconds=0.0006, large_bytes=400_000, large_seconds=0.0018,
                            latency_seconds=0.0006, seconds_per_byte=3e-9)
    mwms = train_report("multi_worker_mirrored", 20.0, 2, ["/job:worker/task:0", "/job:worker/task:1"], workers=2,
                        collectives=costs)
    return ({"normal": train_report("default", 10.0), "multi_worker_mirrored": mwms},
            {name: evaluation(name, 0.95) for name in ("normal", "multi_worker_mirrored")})
