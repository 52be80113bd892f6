"""Benchmark: the speed knobs of the normal run, to choose their defaults.

``train.steps_per_execution`` (steps per call into the runtime) and
``train.jit_compile`` (XLA), at batch 25, default strategy, the prepared
digits tiled to 60,000, with the project's thread settings; and TensorFlow's
default thread pools against the project's. Every cell trains in a process of
its own (thread pools are fixed per process), the cells alternating round by
round.

    python -m benchmarks knobs [--rounds 3] [--epochs 4]
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import config, in_own_process, prepared, train_quietly
from benchmarks.harness import Options
from benchmarks.results import Result, spread

TITLE = "the normal run's speed knobs at batch 25: steps per call into the runtime, XLA, the thread pools"
DEFAULTS = {"models": ("mlp",), "batches": (25,), "epochs": 4}
STEPS = (1, 10, 50, 200, 2400)  # 2400 = a whole epoch of 60,000 at batch 25
#: The thread pools compared, at steps_per_execution 50 without XLA: TensorFlow's choice (0, 0) and the project's.
THREADS = ("tensorflow", "project")


def one(epochs: int, threads: str, steps_per_execution: int, jit_compile: bool) -> float:
    """Steady samples/s of one normal training in this process, with ``threads``' pools."""
    from tfdist.distribute.builders import build_strategy
    from tfdist.distribute.registry import get_spec
    from tfdist.runtime.threads import configure_threads, op_threads

    configure_threads(*((0, 0) if threads == "tensorflow" else op_threads(config())))
    spec = get_spec("default")
    strategy, info = build_strategy(spec)
    result = train_quietly(config(epochs=epochs, steps_per_execution=steps_per_execution, jit_compile=jit_compile),
                           spec, strategy, info, prepared("train", 60_000), prepared("val"))
    return result.steady_samples_per_second


def cells(options: Options) -> list[dict[str, Any]]:
    knobs = [{"threads": "project", "steps": steps, "jit": jit} for steps in STEPS for jit in (False, True)]
    return [*knobs, {"threads": "tensorflow", "steps": 50, "jit": False}]


def measure(cell: dict[str, Any], context: Any, options: Options) -> dict[str, float]:
    call = f"one({options.epochs}, {cell['threads']!r}, {cell['steps']}, {cell['jit']})"
    return {"samples_per_second": in_own_process(__name__, call)}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    def speed(**params: Any) -> str:
        cell = result.cell(**params)
        return spread(cell.values("samples_per_second"), 0) if cell else "–"

    rows = [[f"{steps}", "project's", speed(threads="project", steps=steps, jit=False),
             speed(threads="project", steps=steps, jit=True)] for steps in STEPS]
    rows.append(["50", "TensorFlow's default", speed(threads="tensorflow", steps=50, jit=False), ""])
    return ["steps_per_execution", "thread pools", "samples/s", "samples/s with jit_compile"], rows
