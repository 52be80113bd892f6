"""Benchmark: float32 / mixed_bfloat16 / mixed_float16 x fit / custom loop.

In one process (policies do not leak between models), default strategy, the
project's thread settings, the prepared digits tiled to 60,000, every
configuration alternating round by round; steady-state samples/s and
validation accuracy, and whether this CPU can make each mixed precision faster.

    python -m benchmarks precision_loop [--rounds 2] [--epochs 4] [--batches 25 256]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks.common import config, prepared, train_quietly
from benchmarks.harness import Options, grid
from benchmarks.results import Result, median

TITLE = "normal training in each precision and loop: samples/s against fit in float32, and validation accuracy"
DEFAULTS = {"models": ("mlp",), "rounds": 2, "epochs": 4}
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
LOOPS = ("fit", "custom")


@dataclass
class Context:
    spec: Any
    strategy: Any
    info: Any
    train: Any
    val: Any


def cells(options: Options) -> list[dict[str, Any]]:
    return grid(options, loop=LOOPS, precision=PRECISIONS)


def setup(options: Options) -> Context:
    from tfdist.distribute.builders import build_strategy
    from tfdist.distribute.registry import get_spec
    from tfdist.runtime.threads import configure_threads, op_threads

    configure_threads(*op_threads(config()))
    spec = get_spec("default")
    strategy, info = build_strategy(spec)
    return Context(spec, strategy, info, prepared("train", 60_000), prepared("val"))


def measure(cell: dict[str, Any], context: Context, options: Options) -> dict[str, float]:
    from tfdist.train.precision import hardware_support

    settings = config(epochs=options.epochs, batch_size=cell["batch"], loop=cell["loop"], precision=cell["precision"])
    result = train_quietly(settings, context.spec, context.strategy, context.info, context.train, context.val)
    return {"samples_per_second": result.steady_samples_per_second,
            "val_accuracy": result.history[-1]["val_accuracy"],
            "can_be_faster": float(cell["precision"] == "float32" or hardware_support(cell["precision"]).can_be_faster)}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    rows = []
    batches = sorted({cell.params["batch"] for cell in result.cells})
    for batch in batches:
        base = result.cell(batch=batch, loop="fit", precision="float32")
        for loop in LOOPS:
            row = [str(batch), loop]
            for precision in PRECISIONS:
                cell = result.cell(batch=batch, loop=loop, precision=precision)
                if cell is None or base is None:
                    row.append("–")
                    continue
                speed = median(cell.values("samples_per_second"))
                ratio = speed / median(base.values("samples_per_second"))
                faster = "" if median(cell.values("can_be_faster")) else ", no fast unit"
                row.append(f"{speed:,.0f} ({ratio:.2f}x, val {median(cell.values('val_accuracy')):.3f}{faster})")
            rows.append(row)
    return ["batch", "loop", *PRECISIONS], rows
