"""The comparison over repeats (``compare.repeats``): medians of the rounds, intervals from the spread between them."""

import pytest

from tfdist.compare.comparison import headline_metrics, rows_from_json, to_json
from tfdist.compare.compute import build_comparison
from tfdist.compare.render import render_markdown
from tfdist.hardware import MachineNoise

from helpers.reports import eval_report, train_report


def history(epoch_seconds: float, reached_in: int, epochs: int = 3) -> list[dict[str, float]]:
    """A run's epochs at one steady time, reaching 0.95 validation accuracy in epoch ``reached_in``."""
    return [{"epoch": i, "epoch_seconds": epoch_seconds, "samples_per_second": 1000 / epoch_seconds, "loss": 0.3,
             "accuracy": 0.9, "val_loss": 0.3, "val_accuracy": 0.95 if i >= reached_in else 0.8}
            for i in range(1, epochs + 1)]


def rounds_of(name: str, strategy: str, epoch_seconds: list[float], reached_in: int = 2, **fields):
    return [(train_report(strategy, 2 * seconds, steady_epoch_seconds=seconds, steady_samples_per_second=1000 / seconds,
                          name=name, **fields),
             history(seconds, reached_in)) for seconds in epoch_seconds]


def comparison(normal: list[float], mirrored: list[float], **mirrored_fields):
    rounds = {"normal": rounds_of("normal", "default", normal),
              "mirrored": rounds_of("mirrored", "mirrored", mirrored, **mirrored_fields)}
    first = {name: found[0][0] for name, found in rounds.items()}
    return build_comparison(first, {name: eval_report(name, 0.95) for name in rounds},
                            {name: found[0][1] for name, found in rounds.items()}, rounds=rounds)


def test_with_repeats_each_ratio_pairs_the_rounds_and_its_interval_is_their_spread():
    # round 1 alone says mirrored is 2x as fast; rounds 2 and 3 say it is not
    result = comparison([1.0, 1.1, 0.9], [0.5, 1.2, 1.0])
    row = result.runs["mirrored"]
    assert row.report.steady_epoch_seconds == 1.0 and result.runs["normal"].report.steady_epoch_seconds == 1.0, \
        "each number is the median of the rounds'"
    assert [r.steady_epoch_seconds for r in row.rounds] == [0.5, 1.2, 1.0]
    assert row.speedup == pytest.approx(1.1 / 1.2), "the median of the rounds' own speed-ups: 2.0, 0.92, 0.90"
    interval = row.interval("speedup")
    assert interval.basis == "3 interleaved repeats of each" and interval.decision == "within"
    assert (interval.low, interval.high) == (pytest.approx(0.9), pytest.approx(2.0)), \
        "the bootstrap of the median of 3 rounds spans the lowest round's ratio to the highest"
    assert result.verdict.startswith("Within noise:") and "3 interleaved repeats of each" in result.verdict
    to_target = row.interval("time_to_accuracy_speedup")
    assert to_target.basis == "3 interleaved repeats of each" and to_target.decision == "within"
    assert row.seconds_to_target == pytest.approx(2.0), "the median round's two epochs"


def test_a_drift_between_rounds_cancels_within_each_round():
    # the machine halved its speed for round 2: both runs slowed alike, and every round says 2x
    row = comparison([1.0, 2.0, 1.0], [0.5, 1.0, 0.5]).runs["mirrored"]
    assert row.speedup == pytest.approx(2.0) and row.interval("speedup").low == pytest.approx(2.0)


def test_repeats_that_agree_decide_and_every_round_is_in_the_report_and_compare_json():
    result = comparison([1.0, 1.05, 0.95], [0.5, 0.52, 0.49])
    row = result.runs["mirrored"]
    assert row.interval("speedup").decision == "above" and row.speedup == pytest.approx(2.0)
    assert result.verdict.startswith("Distribution paid off: mirrored trained 2.00x (")
    assert headline_metrics(row)["speedup_low"] > 1.8
    markdown = render_markdown(result)
    assert "## Rounds" in markdown and "| mirrored | 1 | 2,000 | 0.500 | 2.00x | – |" in markdown
    assert "|  | 3 | 2,041 | 0.490 | 1.94x | – |" in markdown
    assert "Every run trained 3 times, interleaved" in markdown
    again = {row.name: row for row in rows_from_json(to_json(result), "compare.json")}
    assert [r.steady_epoch_seconds for r in again["mirrored"].rounds] == [0.5, 0.52, 0.49]


def test_a_round_whose_machine_was_disturbed_is_named_in_the_verdict_and_the_rounds_table():
    busy = MachineNoise(steal_percent=0.0, others_percent=40.0, usable_cpus=2)
    rounds = {"normal": rounds_of("normal", "default", [1.0, 1.0, 1.0]),
              "mirrored": rounds_of("mirrored", "mirrored", [0.5, 0.5, 0.5])}
    report, history_ = rounds["mirrored"][1]
    rounds["mirrored"][1] = (train_report("mirrored", 1.0, steady_epoch_seconds=0.9, name="mirrored", machine=busy),
                             history_)
    first = {name: found[0][0] for name, found in rounds.items()}
    result = build_comparison(first, {name: eval_report(name, 0.95) for name in rounds},
                              {name: found[0][1] for name, found in rounds.items()}, rounds=rounds)
    assert "While mirrored trained, round 2: " in result.verdict and busy.what() in result.verdict
    assert f"| 2 | 1,000 | 0.900 | 1.11x | {busy.what()} |" in render_markdown(result)
