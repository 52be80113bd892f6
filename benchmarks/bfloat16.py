"""Benchmark: mixed_bfloat16 against float32, side by side, in throughput and in time to accuracy.

bfloat16 halves the bytes of every activation and runs matrix work on a
bfloat16 unit where the CPU has one (AVX512-BF16 or AMX); without one, oneDNN
converts to float32 and back around every op. This reads the CPU at run time
and says which case it measured. Normal training through the real train stage
on all of this machine's CPUs (``runtime.onednn: auto``: oneDNN, which runs
bfloat16's kernels, is on for the convnet), the prepared digits tiled to
12,000, the two precisions alternating within every round; the table gives
the median step and its spread, the speed and the time to the model's target
validation accuracy (mlp 0.90, cnn 0.95) against float32.

    python -m benchmarks bfloat16 [--models mlp cnn] [--batches 25 256] [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

import sys
from typing import Any

from benchmarks.harness import Options, grid
from benchmarks.results import Result, median, spread
from benchmarks.stage import TARGETS, StageRuns, model_settings
from tfdist.compare.compute import time_to_accuracy
from tfdist.train.precision import hardware_support

TITLE = "Normal training in mixed_bfloat16 against float32: the step, the speed and the time to accuracy"
PRECISIONS = ("float32", "mixed_bfloat16")


def cells(options: Options) -> list[dict[str, Any]]:
    if unknown := sorted(set(options.models) - set(TARGETS)):
        raise SystemExit(f"error: --models {unknown}: no target accuracy for them; choose from {sorted(TARGETS)}")
    return grid(options)


def setup(options: Options) -> StageRuns:
    support = hardware_support("mixed_bfloat16")
    print(f"bfloat16 unit: {'yes' if support.can_be_faster else 'no'} ({support.reason})", file=sys.stderr)
    return StageRuns.make("bfloat16")


def measure(cell: dict[str, Any], context: StageRuns, options: Options) -> dict[str, float]:
    """Both precisions one after the other, so each round sets them side by side."""
    sets = model_settings(cell, options)
    base, bf16 = (context.train("default", [*sets, f"train.precision={p}"]) for p in PRECISIONS)
    target = TARGETS[cell["model"]]
    tta, base_tta = time_to_accuracy(bf16["history"], target), time_to_accuracy(base["history"], target)
    return {"float32_ms": base["step_ms"], "bfloat16_ms": bf16["step_ms"],
            "speed": bf16["steady_samples_per_second"] / base["steady_samples_per_second"],
            "time_to_accuracy": base_tta[1] / tta[1] if tta and base_tta else None,
            "float32_accuracy": base["val_accuracy"], "bfloat16_accuracy": bf16["val_accuracy"]}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    rows = []
    for c in result.cells:
        tta = c.values("time_to_accuracy")
        rows.append([c.params["model"], str(c.params["batch"]), spread(c.values("float32_ms")),
                     spread(c.values("bfloat16_ms")), spread(c.values("speed")) + "x",
                     spread(tta) + "x" if len(tta) == len(c.rounds) else "not reached",
                     f"{median(c.values('float32_accuracy')):.4f} / {median(c.values('bfloat16_accuracy')):.4f}"])
    return (["model", "batch", "float32 (ms/step)", "mixed_bfloat16 (ms/step)", "bfloat16's speed vs float32",
             "time to accuracy vs float32", "val accuracy (float32 / bfloat16)"], rows)
