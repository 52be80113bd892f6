"""Benchmark: a multi_worker_mirrored step's parts, step by step, from TensorFlow's profiler in both workers.

Runs the train stage for multi_worker_mirrored with 2 workers through the
local launcher (each pinned to a CPU of its own, on loopback), both serving
TensorFlow's profiler (``TFDIST_PROFILER_PORT``). From epoch 3 it captures
``--set ms=...`` of both at once and pairs their gradient all-reduces (the
two end together), then splits every step of the worker that came last to
its all-reduce, so that the parts add up to the step:

- compute: its ops' time between its two all-reduces (overlapping ops counted once);
- between ops: the rest of that time (the executor's hand-offs, the input's next batch);
- the wire: its all-reduce, which the other was already in;

and beside them what the slower peer cost: how long the earlier worker had
waited in the all-reduce for the later one. The run's own calibration is set
beside them: the same step timed alone in the worker (``compute_seconds``) and
the bare all-reduce probe, so that the table shows how much slower the same ops
ran inside the strategy's step than alone.

``--set 'settings=["", train.steps_per_execution=1]'`` runs every cell with each (the train stage's
``--set``, several joined by spaces; "" for none), alternated round by round.

    python -m benchmarks step_parts [--models cnn] [--batches 25 256] [--rounds 3] [--epochs 8] [--set ms=2000]
        [--set 'settings=["", KEY=VALUE ...]']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.harness import Options, grid
from benchmarks.results import Cell, Result, median, spread
from benchmarks.stage import StageRuns, model_settings, report
from benchmarks.traces import profiled_stage
from tfdist.train.trace_parts import NoSteps, host_events, mean_parts

TITLE = "A multi_worker_mirrored step's parts, from TensorFlow's profiler in both workers"
DEFAULTS = {"models": ("cnn",), "epochs": 8, "extra": {"ms": 2000}}
WORKERS = 2
#: The op TensorFlow runs when it did not rewrite a pooling gradient to oneDNN's (``_MklNativeMaxPoolGrad``).
_EIGEN_POOLING_GRADIENT = ":MaxPoolGrad"


def cells(options: Options) -> list[dict[str, Any]]:
    return grid(options, settings=options.extra.get("settings", [""]))


def setup(options: Options) -> StageRuns:
    return StageRuns.make("step-parts")


def profiled_run(context: StageRuns, sets: list[str], ms: int) -> tuple[Path, str]:
    """The train stage with both workers serving the profiler, ``ms`` of them captured (:func:`profiled_stage`)."""
    name = context.name()
    sets = [*sets, f"distributed.workers={WORKERS}"]
    return profiled_stage(context.root, context.data, name, "multi_worker_mirrored", sets, WORKERS, ms), name


def measure(cell: dict[str, Any], context: StageRuns, options: Options) -> dict[str, float]:
    sets = [*model_settings(cell, options), *cell["settings"].split()]
    logdir, name = profiled_run(context, sets, int(options.extra.get("ms", 2000)))
    traces = sorted(logdir.rglob("*.xplane.pb"))
    if len(traces) != WORKERS:
        raise SystemExit(f"error: captured {len(traces)} of {WORKERS} workers under {logdir}")
    events = [host_events(trace) for trace in traces]
    try:
        parts, steps = mean_parts(*events)
    except NoSteps as why:
        raise SystemExit(f"error: {why}; capture longer (--set ms=...) or more epochs") from None
    collectives = report(context.root, name).get("collectives") or {}
    fallbacks = sum(any(name.endswith(_EIGEN_POOLING_GRADIENT) for name, _, _ in worker) for worker in events)
    return {**parts, "steps": float(steps), "eigen_pooling_gradient_workers": float(fallbacks),
            "compute_alone_ms": 1e3 * (collectives.get("compute_seconds") or 0.0),
            "probe_ms": 1e3 * (collectives.get("large_seconds") or 0.0)}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """A row per cell and pooling gradient: the rounds every worker ran oneDNN's, and those one ran Eigen's."""
    rows = []
    for c in result.cells:
        for eigen in (False, True):
            rounds = [r for r in c.rounds if (r["eigen_pooling_gradient_workers"] > 0) == eigen]
            if not rounds:
                continue
            group = Cell(c.params, rounds)
            inside, alone = median(group.values("compute_ms")), median(group.values("compute_alone_ms"))
            rows.append([c.params["model"], str(c.params["batch"]), c.params["settings"],
                         "Eigen's in a worker" if eigen else "oneDNN's", f"{len(rounds)} of {len(c.rounds)}",
                         *(spread(group.values(key)) for key in ("step_ms", "compute_ms", "between_ops_ms", "wire_ms",
                                                                  "waiting_ms", "compute_alone_ms")),
                         f"{inside / alone:.2f}x" if alone else "", spread(group.values("probe_ms"))])
    return ["model", "per-replica batch", "settings", "pooling gradient", "rounds", "step (ms)", "compute in it",
            "between ops", "the wire", "(the earlier worker waited)", "the same step alone",
            "compute in the step vs alone", "bare all-reduce probe"], rows
