"""Benchmark: how much slower one CPU of this machine computes while its other CPU computes too.

The emulated machines (benchmarks/emulated_machines.py) are CPUs of one
machine. Separate machines share nothing, but these CPUs share caches, memory
bandwidth and, on a virtual machine, whatever the host gives its virtual CPUs
at once. This runs normal training pinned to CPU 0 alone, then again with a
twin of it pinned to CPU 1 at the same time, alternating round by round, for
each model and per-replica batch (12,000 digits tiled from the prepared ones);
the ratio of the two steps is what the emulation charges every machine of a
cluster that one machine training alone does not pay.

    python -m benchmarks shared_cores [--models mlp cnn] [--batches 25 256] [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

import subprocess
from typing import Any

from benchmarks.common import step_ms
from benchmarks.harness import Options, grid
from benchmarks.results import Result, median, spread
from benchmarks.stage import StageRuns, model_settings, report, stage_command
from tfdist.hardware import usable_cpus

TITLE = "Normal training pinned to one CPU, alone and beside a twin on the other CPU"


def cells(options: Options) -> list[dict[str, Any]]:
    if len(usable_cpus()) < 2:
        raise SystemExit("error: this needs 2 CPUs or more")
    return grid(options)


def setup(options: Options) -> StageRuns:
    return StageRuns.make("shared-cores")


def steps_ms(context: StageRuns, names: list[str], sets: list[str]) -> list[float]:
    """Normal training once per name, all at the same time, the i-th pinned to the i-th CPU: each one's ms/step."""
    cpus = usable_cpus()
    processes = [subprocess.Popen(["taskset", "-c", str(cpus[i]),
                                   *stage_command(context.root, context.data, name, "default", sets)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for i, name in enumerate(names)]
    for name, process in zip(names, processes, strict=True):
        _, err = process.communicate(timeout=1800)
        if process.returncode:
            raise SystemExit(f"{name}: the train stage exited {process.returncode}:\n{err[-2000:]}")
    return [step_ms(report(context.root, name)) for name in names]


def measure(cell: dict[str, Any], context: StageRuns, options: Options) -> dict[str, float]:
    sets = model_settings(cell, options)
    (alone,) = steps_ms(context, [context.name()], sets)
    beside, _twin = steps_ms(context, [context.name(), context.name()], sets)
    return {"alone_ms": alone, "beside_ms": beside}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    rows = [[c.params["model"], str(c.params["batch"]), spread(c.values("alone_ms")), spread(c.values("beside_ms")),
             f"{median(c.values('beside_ms')) / median(c.values('alone_ms')):.2f}x"] for c in result.cells]
    return ["model", "batch", "alone (ms/step)", "beside a twin (ms/step)", "slower by"], rows
