"""Readings with their intervals: the statistics on known samples, and a verdict that says "within noise" when it cannot tell."""

import json

import pytest

from tfdist.compare.comparison import Network, headline_metrics
from tfdist.compare.compute import build_comparison, projection
from tfdist.compare.noise import (
    EPOCH_RESOLUTION,
    WITHIN_ONE_RUN,
    Interval,
    median_interval,
    ratio_interval,
    repeats_to_decide,
    time_to_accuracy_interval,
)
from tfdist.compare.render import render_markdown
from tfdist.records.reports import CollectiveCosts

from helpers.reports import eval_report, train_report


def test_the_interval_of_a_ratio_of_medians_spans_what_resampling_the_epochs_can_give():
    # every bootstrap median of normal's epochs is 1.0, 1.1 or 1.2; of the run's, 2.0
    found = ratio_interval([1.0, 1.1, 1.2, 1.1, 1.1], [2.0, 2.0, 2.0], better="lower")
    assert found is not None and found.basis == WITHIN_ONE_RUN
    assert 0.5 <= found.low <= found.high <= 0.6 and found.low < 0.55 < found.high
    assert found.decision == "below"
    throughput = ratio_interval([100.0, 100.0], [150.0, 160.0, 155.0], better="higher")
    assert throughput is not None and throughput.decision == "above" and 1.5 <= throughput.low <= throughput.high <= 1.6
    assert ratio_interval([1.0], [1.0, 2.0], better="lower") is None, "one epoch has no spread to measure"
    assert ratio_interval([1.0, 1.1], [1.0, 1.1], "lower") == ratio_interval([1.0, 1.1], [1.0, 1.1], "lower"), "seeded"


def test_a_ratio_whose_samples_straddle_one_is_within_noise_and_says_how_many_runs_would_decide():
    normal, run = [1.0, 1.3, 0.9, 1.2], [1.1, 0.95, 1.25, 1.0]
    found = ratio_interval(normal, run, better="lower")
    assert found is not None and found.low < 1 < found.high and found.decision == "within"
    assert str(found) == f"{found.low:.2f}x-{found.high:.2f}x"
    assert repeats_to_decide(normal, run, 1.02) > repeats_to_decide(normal, run, 1.2) >= 2, \
        "the closer to 1.0, the more runs the same spread needs"
    assert repeats_to_decide(normal, run, 1.0) is None and repeats_to_decide([1.0], run, 1.2) is None


def test_time_to_accuracy_s_interval_is_the_epoch_each_run_reached_the_target_in():
    found = time_to_accuracy_interval((4.0, 6.0), (2.0, 3.0))  # normal in its 3rd 2-s epoch, the run in its 2nd 1-s one
    assert found == Interval(4 / 3, 3.0, EPOCH_RESOLUTION) and found.decision == "above"
    assert time_to_accuracy_interval((4.0, 6.0), (0.0, 1.0)) is None


def test_median_interval_is_a_figure_s_error_bar():
    low, high = median_interval([10.0, 12.0, 11.0])
    assert 10.0 <= low <= 11.0 <= high <= 12.0 and median_interval([10.0]) is None


def history(seconds: list[float], accuracy: list[float], samples: int = 1000) -> list[dict[str, float]]:
    return [{"epoch": i + 1, "epoch_seconds": s, "samples_per_second": samples / s, "loss": 0.3, "accuracy": a,
             "val_loss": 0.3, "val_accuracy": a} for i, (s, a) in enumerate(zip(seconds, accuracy, strict=True))]


def comparison(normal_epochs: list[float], run_epochs: list[float]):
    """normal and mirrored, each report's steady epoch time the median of its epochs after the first."""
    accuracy = [0.5, 0.8, 0.9, 0.96, 0.97, 0.98]
    reports = {
        name: train_report(strategy, sum(epochs), steady_epoch_seconds=sorted(epochs[1:])[len(epochs[1:]) // 2],
                           steady_samples_per_second=1000 / sorted(epochs[1:])[len(epochs[1:]) // 2], epochs=len(epochs))
        for name, strategy, epochs in (("normal", "default", normal_epochs), ("mirrored", "mirrored", run_epochs))}
    histories = {"normal": history(normal_epochs, accuracy[:len(normal_epochs)]),
                 "mirrored": history(run_epochs, accuracy[:len(run_epochs)])}
    return build_comparison(reports, {name: eval_report(name, 0.95) for name in reports}, histories)


def test_a_speed_up_within_noise_is_not_called_paid_off_and_its_interval_is_in_every_view():
    noisy = comparison([2.0, 1.0, 1.3, 0.9, 1.2, 1.0], [2.0, 0.92, 1.25, 1.1, 0.95, 1.2])  # medians 1.0 and 1.1
    row = noisy.runs["mirrored"]
    assert row.speedup == pytest.approx(1.0 / 1.1)
    assert row.interval("speedup").decision == "within"
    assert noisy.verdict.startswith("Within noise: the fastest strategy, mirrored, ran at 0.91x (")
    assert "steady epochs within one run" in noisy.verdict and "runs of each to tell" in noisy.verdict
    assert row.repeats_to_decide == 18 and "compare.repeats" not in noisy.verdict, "too close to 1.0 to be worth it"
    close = comparison([2.0, 1.0, 1.1, 0.9, 1.05, 0.95], [2.0, 0.85, 1.0, 0.8, 0.95, 0.88])
    assert close.runs["mirrored"].repeats_to_decide == 4 and "would need about 4 runs of each to tell " \
        "(`dvc exp run -S compare.repeats=4` runs them, interleaved)" in close.verdict, "a close call says how to decide it"
    assert "paid off" not in noisy.verdict and "Train without distribution" in noisy.advice.use
    table = render_markdown(noisy)
    assert f"0.91x ({row.vs_normal_low['speedup']:.2f}-{row.vs_normal_high['speedup']:.2f})" in table
    headline = headline_metrics(row)
    assert headline["speedup_low"] < 1 < headline["speedup_high"] and "throughput_speedup_low" in headline
    json.dumps(headline)  # metrics.json takes it as it is


def test_a_speed_up_wholly_above_one_is_paid_off_and_one_wholly_below_did_not():
    faster = comparison([3.0, 2.0, 2.1, 1.9, 2.0], [2.0, 1.0, 1.05, 0.95, 1.0])
    assert faster.runs["mirrored"].interval("speedup").decision == "above"
    assert faster.verdict.startswith("Distribution paid off: mirrored trained 2.00x (")
    assert faster.advice.use.startswith("Use mirrored: it trained 2.00x (")
    slower = comparison([2.0, 1.0, 1.05, 0.95, 1.0], [3.0, 2.0, 2.1, 1.9, 2.0])
    assert slower.verdict.startswith("Distribution did not pay off on this hardware: the fastest strategy, mirrored, "
                                     "ran at 0.50x (")
    to_target = slower.runs["mirrored"]
    assert to_target.time_to_accuracy_low is not None and to_target.time_to_accuracy_high < 1, \
        "both reached 0.95 in epoch 4: the run's whole epoch 4 ends after normal's does"


def test_the_projection_carries_the_spread_of_its_measured_terms_as_a_band():
    # 25 examples a step per worker; normal's steady epochs and the run's, each a little unsteady
    costs = CollectiveCosts(workers=2, small_bytes=4, small_seconds=1e-3, large_bytes=400_000, large_seconds=1.8e-3,
                            latency_seconds=1e-3, seconds_per_byte=2e-9, small_samples=[0.9e-3, 1e-3, 1.2e-3],
                            large_samples=[1.6e-3, 1.8e-3, 2.1e-3])
    normal_epochs, run_epochs = [2.0, 1.0, 1.1, 0.95, 1.05], [1.0, 0.2, 0.22, 0.19, 0.21]
    reports = {
        "normal": train_report("default", 10.0, steady_samples_per_second=1000.0, steady_epoch_seconds=1.0),
        "multi_worker_mirrored": train_report(
            "multi_worker_mirrored", 5.0, 2, ["/job:worker/task:0", "/job:worker/task:1"], workers=2,
            steady_samples_per_second=5000.0, steady_epoch_seconds=0.2, collectives=costs),
    }
    accuracy = [0.5, 0.8, 0.9, 0.96, 0.97]
    histories = {"normal": history(normal_epochs, accuracy), "multi_worker_mirrored": history(run_epochs, accuracy)}
    built = build_comparison(reports, {name: eval_report(name, 0.95) for name in reports}, histories)
    (p,) = projection(built.rows, Network(1.0, 100.0), histories=histories)
    for n, value in p.projected_speedup.items():
        assert p.speedup_low[n] < value < p.speedup_high[n], f"{n} machines: the point inside its band"
    assert p.ceiling_low < p.ceiling_speedup < p.ceiling_high
    assert p.break_even_machines is not None and p.break_even_fewest <= p.break_even_machines
    assert p.break_even_most is None or p.break_even_machines <= p.break_even_most
    assert p.break_even_text().startswith(f"{p.break_even_machines} machines (")
    without = projection(built.rows, Network(1.0, 100.0))[0]
    assert without.speedup_low == {} and without.projected_speedup == p.projected_speedup, "no spread recorded: no band"
