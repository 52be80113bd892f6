"""A synchronous step's parts, read from two workers' traces: compute, the time between ops, the wire, the wait.

The traces are those ``train.profile_steps`` captures (:mod:`tfdist.train.profiling`)
or a benchmark does through the profiler servers (``benchmarks/step_parts.py``):
each worker's host events, on the machine's clock (tasks of one machine share it,
so their events line up; across machines the pairing below needs only each
all-reduce's end, which both workers reach together). The gradients' all-reduces
pair the workers' steps; every step is split on the worker that came last to its
all-reduce, so that the parts add up to the step:

- compute: its ops' time between its two all-reduces (overlapping ops counted once);
- between ops: the rest of that time (the executor's hand-offs, the input's next batch);
- the wire: its all-reduce, which the other was already in;

and beside them what the slower peer cost: how long the earlier worker waited in
the all-reduce for the later one.
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: One host event: (name, start, end), in picoseconds of the machine's clock.
Event = tuple[str, int, int]
#: The all-reduces the metrics' results make once a call: not the gradients'.
_METRIC_REDUCE = "div_no_nan"
#: The parts of a step, each in ms, in the order they add up.
PARTS = ("step_ms", "compute_ms", "between_ops_ms", "wire_ms", "waiting_ms")


class NoSteps(ValueError):
    """The traces hold too few paired steps to split (a capture too short, or no all-reduce between workers)."""


def host_events(path: Path) -> list[Event]:
    """Every host event of one task's trace (``.xplane.pb``)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    found = []
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            found += [(names.get(event.metadata_id, "?"), base + event.offset_ps,
                       base + event.offset_ps + event.duration_ps) for event in line.events]
    return found


def gradient_reduces(events: list[Event]) -> list[tuple[int, int]]:
    """The spans of the gradients' all-reduce, one a step: the most frequent collective of the capture."""
    counts: dict[str, int] = {}
    for name, _, _ in events:
        if name.endswith(":CollectiveReduceV2") and _METRIC_REDUCE not in name:
            counts[name] = counts.get(name, 0) + 1
    if not counts:
        raise NoSteps("the trace holds no all-reduce of the gradients")
    gradients = max(counts, key=lambda name: counts[name])
    return sorted((start, end) for name, start, end in events if name == gradients)


def busy(spans: list[tuple[int, int]], low: int, high: int) -> int:
    """How much of ``[low, high]`` the ``spans`` cover, each moment once."""
    covered, reach = 0, low
    for start, end in spans:
        start, end = max(start, reach), min(end, high)
        if end > start:
            covered += end - start
            reach = end
    return covered


def _is_op(name: str) -> bool:
    """Whether a host event is an op's kernel (``node/name:OpType``), not a runtime activity."""
    return ":" in name and "::" not in name and " " not in name and not name.startswith(":")


def step_parts(first: list[Event], second: list[Event]) -> list[dict[str, float]]:
    """Each step both workers' traces hold, split (ms): :data:`PARTS`."""
    workers = []
    for events in (first, second):
        ops = sorted((start, end) for name, start, end in events if _is_op(name) and "Collective" not in name)
        workers.append((gradient_reduces(events), ops))
    (reduces_a, _), (reduces_b, _) = workers
    pairs = [(a, min(reduces_b, key=lambda b: abs(b[1] - a[1]))) for a in reduces_a]  # they end together
    steps = []
    for before, now in zip(pairs, pairs[1:], strict=False):
        later = max((0, 1), key=lambda w: now[w][0])
        ops = workers[later][1]
        window_start, arrived, end = before[later][1], now[later][0], now[later][1]
        if arrived <= window_start:
            continue
        compute = busy(ops, window_start, arrived)  # the step: the later worker's, all-reduce end to all-reduce end
        steps.append({"step_ms": (end - window_start) / 1e9, "compute_ms": compute / 1e9,
                      "between_ops_ms": (arrived - window_start - compute) / 1e9, "wire_ms": (end - arrived) / 1e9,
                      "waiting_ms": (arrived - now[1 - later][0]) / 1e9})
    return steps


def steady(steps: list[dict[str, float]]) -> list[dict[str, float]]:
    """The steps within an epoch: those a validation or an epoch's end lands in (over 1.5x the median) left out."""
    typical = statistics.median(step["step_ms"] for step in steps)
    return [step for step in steps if step["step_ms"] <= 1.5 * typical]


def mean_parts(first: list[Event], second: list[Event], least: int = 3) -> tuple[dict[str, float], int]:
    """The mean of each part over the steady steps two workers' traces hold, and how many there were.

    Means, not medians: each step's parts add up to it, and so do their means, where the medians of parts
    that trade off (a descheduled worker's step has less compute and more time between ops) need not.

    Raises:
        NoSteps: fewer than ``least`` steady steps.
    """
    steps = steady(step_parts(first, second)) if first and second else []
    if len(steps) < least:
        raise NoSteps(f"only {len(steps)} steps paired in the traces; profile more steps (train.profile_steps)")
    return {key: statistics.fmean(step[key] for step in steps) for key in PARTS}, len(steps)


def traced_parts(traces: list[Path]) -> dict[str, Any] | None:
    """The step's parts from two workers' traces as the train report's ``traced_*`` fields, and the steps they are
    the mean of; None, said in one line, where the traces hold too few steps."""
    try:
        parts, steps = mean_parts(host_events(traces[0]), host_events(traces[1]))
    except NoSteps as why:
        log.warning("profiling: the step's parts are not split (%s)", why)
        return None
    return {**{f"traced_{key}": value for key, value in parts.items()}, "traced_steps": steps}
