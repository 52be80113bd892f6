"""How sure a ratio is: its interval from what the runs measured, and whether that interval decides against 1.0.

Every reading tfdist gives is a ratio of two timings, on machines whose speed
moves more than many of the differences it reports. With one run of each, the
spread comes from what each run has: its steady epochs, each a timing of the
same work. The interval of a ratio of steady times is a percentile bootstrap
of the ratio of the two runs' medians (the statistic the reports give:
medians, as one disturbed epoch should not move them), each run's steady
epochs resampled on their own, seeded so that a report is reproducible. It is
labelled "within one run": it says how steady each run was, not how much the
next run, on a busier machine, would differ; only repeats measure that. With
repeats (``compare.repeats``), the rounds are interleaved, so each round's run
pairs with normal training's of the same round: the ratio is the median of the
rounds' ratios and its interval the bootstrap of that median over rounds
(:func:`paired_interval`), the spread between runs with the drift between rounds cancelled.

Time to accuracy has a resolution besides: a run is seen to reach the target
only at the end of an epoch, so it got there somewhere within that epoch. Its
interval is that resolution: the ratio's extremes with each run anywhere within
its epoch (the first epoch starting once its overhead, tracing and
connecting, is paid).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

#: The intervals' confidence, and the resamples of a bootstrap.
LEVEL = 0.95
RESAMPLES = 4000
#: What an interval rests on, as the report says it.
WITHIN_ONE_RUN = "steady epochs within one run"
EPOCH_RESOLUTION = "the epoch each run reached the target in"

Decision = Literal["above", "below", "within"]


@dataclass(frozen=True)
class Interval:
    """A ratio's interval (above 1: better than normal training) and what it rests on."""

    low: float
    high: float
    basis: str

    @property
    def decision(self) -> Decision:
        """``above`` or ``below`` 1.0 when the whole interval is; ``within`` when it straddles 1.0 (noise cannot tell)."""
        return "above" if self.low > 1 else "below" if self.high < 1 else "within"

    def __str__(self) -> str:
        return f"{self.low:.2f}x-{self.high:.2f}x"


def steady(history: Sequence[Mapping[str, float]], column: str) -> list[float]:
    """The steady-state samples of a history's per-epoch ``column``: every epoch after the first (rows without it skipped)."""
    return [row[column] for row in history[1:] if column in row]


def between_repeats(rounds: int) -> str:
    """What an interval over repeats rests on, as the report says it."""
    return f"{rounds} interleaved repeats of each"


def ratio_interval(normal: Sequence[float], run: Sequence[float], better: Literal["higher", "lower"],
                   around: float | None = None, basis: str = WITHIN_ONE_RUN) -> Interval | None:
    """The interval of normal's median over the run's (``better`` lower: times) or the run's over normal's (higher).

    ``around``: the ratio as the reports state it; the interval is then the
    bootstrap's spread about the samples' own ratio, carried onto it (they
    differ only where a median of an even count is read two ways). None where
    a run has fewer than 2 samples: one epoch has no spread to measure.
    ``basis``: what the samples are (a run's steady epochs; with repeats, each round's median).
    """
    if len(normal) < 2 or len(run) < 2:
        return None
    rng = np.random.default_rng(0)
    normal_medians, run_medians = bootstrap_medians(normal, rng), bootstrap_medians(run, rng)
    ratios = normal_medians / run_medians if better == "lower" else run_medians / normal_medians
    low, high = band(ratios)
    if around is not None:
        own = float(np.median(normal) / np.median(run) if better == "lower" else np.median(run) / np.median(normal))
        low, high = low * around / own, high * around / own
    return Interval(float(low), float(high), basis)


def median_interval(samples: Sequence[float]) -> tuple[float, float] | None:
    """The bootstrap interval of one run's median (a figure's error bar); None for fewer than 2 samples."""
    if len(samples) < 2:
        return None
    low, high = band(bootstrap_medians(samples, np.random.default_rng(0)))
    return float(low), float(high)


def bootstrap_medians(samples: Sequence[float], rng: np.random.Generator) -> np.ndarray:
    """:data:`RESAMPLES` medians of ``samples`` resampled with replacement (one sample: itself, every time)."""
    return np.median(rng.choice(np.asarray(samples, float), (RESAMPLES, len(samples))), axis=1)


def bootstrap_about(samples: Sequence[float], value: float, rng: np.random.Generator) -> np.ndarray:
    """:func:`bootstrap_medians` of ``samples`` carried onto ``value`` (the statistic a report states for them)."""
    return bootstrap_medians(samples, rng) * (value / float(np.median(samples)))


def band(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """The :data:`LEVEL` central interval of bootstrap ``values`` along ``axis``: (low, high)."""
    return np.quantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2], axis=axis)


def repeats_to_decide(normal: Sequence[float], run: Sequence[float], ratio: float) -> int | None:
    """Runs of each the measured spread would need before a ratio this far from 1.0 is told from noise.

    From the spread of the samples (log scale, so a ratio's), as if each repeat
    were as steady as these runs: n = (z · s / |ln ratio|)², at least 2. None
    where the ratio is 1.0 or a run has fewer than 2 samples.
    """
    if len(normal) < 2 or len(run) < 2:
        return None
    return _runs_needed(math.sqrt(np.var(np.log(normal), ddof=1) + np.var(np.log(run), ddof=1)), ratio)


def paired_interval(ratios: Sequence[float], basis: str) -> Interval | None:
    """The interval of the median of per-round ratios (each round's run against normal's same round); None for one.

    Interleaved rounds pair up in time: a machine that drifted between rounds
    moved both runs of a round alike, and the round's ratio cancels it. The
    percentile bootstrap of the median over rounds; with 3 rounds it is the
    lowest to the highest round's ratio, so only rounds that all agree decide.
    """
    if len(ratios) < 2:
        return None
    low, high = band(bootstrap_medians(ratios, np.random.default_rng(0)))
    return Interval(float(low), float(high), basis)


def paired_repeats_to_decide(ratios: Sequence[float]) -> int | None:
    """:func:`repeats_to_decide` for per-round ratios: the rounds the spread of their ratios would need."""
    if len(ratios) < 2:
        return None
    return _runs_needed(float(np.std(np.log(ratios), ddof=1)), float(np.median(ratios)))


def _runs_needed(spread: float, ratio: float) -> int | None:
    """n = (z · s / |ln ratio|)², at least 2, for a log-scale spread ``s``; None where the ratio is 1.0 (or not positive)."""
    if ratio <= 0 or ratio == 1:
        return None
    z = 1.959963984540054  # the normal quantile of LEVEL, two-sided
    return max(2, math.ceil((z * spread / abs(math.log(ratio))) ** 2))


def time_to_accuracy_interval(normal: tuple[float, float], run: tuple[float, float]) -> Interval | None:
    """The interval of normal's time to the target over the run's, each ``(start, end)`` of the epoch it got there in."""
    (normal_start, normal_end), (run_start, run_end) = normal, run
    if run_start <= 0 or run_end <= 0:
        return None
    return Interval(normal_start / run_end, normal_end / run_start, EPOCH_RESOLUTION)
