"""Benchmark: the train stage's step with TensorFlow's oneDNN kernels on and at TensorFlow's own default.

``runtime.onednn: enabled`` sets ``TF_ENABLE_ONEDNN_OPTS=1`` in every training
process; ``tensorflow`` leaves TensorFlow's default, which on an x86 CPU without
AVX-512 is off. This measures both through the real train stage, on all of this
machine's CPUs: normal training for each model kind, and for the convnet also
mirrored with one device (a strategy of one replica: nothing to exchange, so
any difference from normal training is the strategy's own step). The prepared
digits are tiled to 12,000.

    python -m benchmarks onednn [--models mlp cnn] [--batches 25 256] [--rounds 3] [--epochs 3]

``--set precision=mixed_float16`` trains in that precision; ``--set settings=[disabled,enabled]``
compares other ``runtime.onednn`` settings (the first is the table's baseline).
"""

from __future__ import annotations

from typing import Any

from benchmarks.harness import Options
from benchmarks.results import Result, median, spread
from benchmarks.stage import StageRuns, model_settings

TITLE = "The train stage's ms/step at TensorFlow's oneDNN default and with oneDNN enabled"
SETTINGS = ("tensorflow", "enabled")
LABELS = {"tensorflow": "TensorFlow's default", "enabled": "oneDNN enabled", "disabled": "oneDNN disabled",
          "auto": "runtime.onednn auto"}
#: The runs of each model: (label, strategy, extra settings).
RUNS = {"mlp": [("normal", "default", [])],
        "cnn": [("normal", "default", []), ("mirrored, 1 device", "mirrored", ["distributed.devices=1"])]}


def settings(options: Options | dict[str, Any]) -> tuple[str, ...]:
    extra = options.extra if isinstance(options, Options) else options
    return tuple(extra.get("settings", SETTINGS))


def cells(options: Options) -> list[dict[str, Any]]:
    return [{"model": model, "batch": batch, "run": label, "onednn": setting}
            for model in options.models for batch in options.batches for label, _, _ in RUNS.get(model, RUNS["cnn"])
            for setting in settings(options)]


def setup(options: Options) -> StageRuns:
    return StageRuns.make("onednn")


def measure(cell: dict[str, Any], context: StageRuns, options: Options) -> dict[str, float]:
    _, strategy, sets = next(found for found in RUNS.get(cell["model"], RUNS["cnn"]) if found[0] == cell["run"])
    precision = options.extra.get("precision", "float32")
    found = context.train(strategy, [*model_settings(cell, options), f"runtime.onednn={cell['onednn']}",
                                     f"train.precision={precision}", *sets])
    return {"ms_per_step": found["step_ms"]}


def table(result: Result) -> tuple[list[str], list[list[str]]]:
    """A row per model, batch and run: both settings side by side, and how much faster oneDNN ran."""
    first, second = settings(result.options)
    rows = []
    for model, batch, label in dict.fromkeys((c.params["model"], c.params["batch"], c.params["run"]) for c in result.cells):
        base, other = (result.cell(model=model, batch=batch, run=label, onednn=s).values("ms_per_step")
                       for s in (first, second))
        rows.append([model, str(batch), label, spread(base), spread(other), f"{median(base) / median(other):.2f}x"])
    return ["model", "batch", "run", f"{LABELS[first]} (ms/step)", f"{LABELS[second]} (ms/step)",
            f"{second} faster by"], rows
