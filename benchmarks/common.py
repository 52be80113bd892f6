"""What the benchmark scripts share: the data, timing of one training run, and markdown tables.

Benchmarks are runnable scripts, not tests: run them from the project root on
an otherwise idle machine, e.g. ``python benchmarks/vs_seed.py``. Each prints
markdown tables (the ones in docs/performance.md came from them).
"""

from __future__ import annotations

import contextlib
import io
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

import tfdist  # noqa: F401  (selects tf_keras before TensorFlow loads)
from tfdist.config import Config, load_config
from tfdist.data import Digits, load_split

PREPARED = Path("data/prepared")


def prepared(split: str, rows: int | None = None) -> Digits:
    """A prepared split (run ``dvc repro preprocess`` first), tiled to ``rows`` rows if given.

    The offline sample has 3,600 training digits; tiling them to MNIST's 60,000
    gives epochs as long as the seed's, so per-epoch costs weigh the same.
    """
    digits = load_split(PREPARED, split)
    if rows is None:
        return digits
    repeat = -(-rows // len(digits))
    return Digits(np.tile(digits.x, (repeat, 1))[:rows], np.tile(digits.y, repeat)[:rows])


def config(**train: Any) -> Config:
    """The project's defaults with ``train`` overrides, MLflow off to the side."""
    overrides = [f"train.{key}={yaml.safe_dump(value, default_flow_style=True).strip()}" for key, value in train.items()]
    folder = Path(tempfile.mkdtemp(prefix="tfdist-bench-"))
    params = folder / "params.yaml"
    params.write_text(Path("params.yaml").read_text())
    return load_config(params, [*overrides, f"mlflow.tracking_uri=sqlite:///{folder}/mlflow.db"])


def quietly(function: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``function`` with Keras's per-epoch lines kept off the terminal."""
    with contextlib.redirect_stdout(io.StringIO()):
        return function(*args, **kwargs)


def median(values: list[float]) -> float:
    return statistics.median(values)


def accuracy(model: Any, test: Digits) -> float:
    probabilities = model.predict(test.x, batch_size=1024, verbose=0)
    return float(np.mean(probabilities.argmax(axis=1) == test.y))


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table; numbers right-aligned."""
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---:" if i else "---" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
