"""What the benchmark scripts share: the data, timing of one training run, and markdown tables.

Benchmarks are runnable scripts, not tests: run them from the project root on
an otherwise idle machine, e.g. ``python -m benchmarks vs_seed``. Each prints
markdown tables (the ones in docs/performance.md came from them).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import yaml

import tfdist  # noqa: F401  (selects tf_keras before TensorFlow loads)
from tfdist.config.knobs import Config
from tfdist.config.params import load_config
from tfdist.data.prepared import (
    MNIST_CLASSES,
    SPLITS,
    DataSpec,
    PreparedSplit,
    Split,
    SplitWriter,
    load_spec,
    load_split,
    scaled,
    write_spec,
)

PREPARED = Path("data/prepared")


def prepared(split: str, rows: int | None = None) -> PreparedSplit:
    """A prepared split (run ``dvc repro preprocess`` first), tiled to ``rows`` rows if given (written once, under
    data/benchmark/).

    The offline sample has 3,600 training digits; tiling them to MNIST's 60,000
    gives epochs as long as the seed's, so per-epoch costs weigh the same.
    """
    spec = load_spec(PREPARED)
    if rows is None:
        return load_split(PREPARED, split, spec)
    folder = Path("data/benchmark") / f"tiled-{split}-{rows}"
    if not (folder / "spec.json").is_file():
        images = load_split(PREPARED, split, spec).read()
        repeat = -(-rows // len(images))
        tiled = Split(np.tile(images.x, (repeat, 1, 1, 1))[:rows], np.tile(images.y, repeat)[:rows])
        write_prepared_folder(folder, spec, {name: tiled for name in SPLITS})
    return load_split(folder, split, spec)


def write_prepared_folder(folder: Path, spec: DataSpec, splits: dict[str, Split]) -> None:
    """A prepared folder of these in-memory splits, as the preprocess stage writes one (the order kept)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    written = {}
    for name, split in splits.items():
        writer = SplitWriter(name, folder, spec, len(split))
        writer.write(split.x, split.y)
        written[name] = writer.close()
    write_spec(folder, spec, written)


#: What :func:`full_size` is, for the models built on it.
FULL_SIZE_SPEC = DataSpec("MNIST (full size)", (28, 28, 1), MNIST_CLASSES)


def train_quietly(settings: Config, spec: Any, strategy: Any, info: Any, train: PreparedSplit, val: PreparedSplit,
                  data: DataSpec | None = None) -> Any:
    """``tfdist.train.fit.train_model`` on MNIST-shaped ``train`` and ``val``, Keras's per-epoch lines kept quiet."""
    from tfdist.train.fit import train_model

    return quietly(train_model, settings, spec, strategy, info, data=data or load_spec(PREPARED), train=train, val=val)


FULL_SIZE = Path("data/benchmark/mnist-60k.npz")


def full_size_mnist(rows: int = 60_000, seed: int = 0) -> Path:
    """A full-size MNIST-format data set (Keras ``mnist.npz`` layout, uint8 28x28) made from real digits.

    The offline sample's 5,000 real digits are split as the pipeline splits them; its
    4,000 train and validation digits become ``rows`` distinct training images by random
    shifts of up to 3 pixels each way (what a real MNIST epoch streams from memory: 47 MB
    of uint8, 188 MB as float32, far beyond any cache, unlike 3,600 digits tiled), and its
    1,000 test digits, never shifted nor trained on, stay the test set. Written once.
    """
    if FULL_SIZE.is_file():
        return FULL_SIZE
    from tfdist.data.sources import load_sample

    raw = load_sample()
    rng = np.random.default_rng(seed)
    images = raw.x_train.take(np.arange(len(raw.x_train))).reshape(-1, 28, 28)
    labels = raw.y_train.astype(np.uint8)
    order = rng.permutation(len(labels))
    test, train = order[:1000], order[1000:]
    picks = rng.choice(train, size=rows)
    shifted = np.zeros((rows, 28, 28), dtype=np.uint8)
    padded = np.pad(images, ((0, 0), (3, 3), (3, 3)))
    for i, (pick, dy, dx) in enumerate(zip(picks, rng.integers(0, 7, rows), rng.integers(0, 7, rows), strict=True)):
        shifted[i] = padded[pick, dy:dy + 28, dx:dx + 28]
    FULL_SIZE.parent.mkdir(parents=True, exist_ok=True)
    np.savez(FULL_SIZE, x_train=shifted, y_train=labels[picks], x_test=images[test], y_test=labels[test])
    return FULL_SIZE


def full_size_prepared(split: str) -> PreparedSplit:
    """:func:`full_size`'s splits as a prepared folder (data/benchmark/mnist-60k/, written once)."""
    folder = Path("data/benchmark/mnist-60k")
    if not (folder / "spec.json").is_file():
        write_prepared_folder(folder, FULL_SIZE_SPEC, {name: full_size(name) for name in SPLITS})
    return load_split(folder, split, FULL_SIZE_SPEC)


def full_size(split: str) -> Split:
    """A split of :func:`full_size_mnist` as the pipeline prepares it (uint8, 28x28x1: :data:`FULL_SIZE_SPEC`).

    ``train`` is all 60,000 shifted digits; ``val`` 1,000 of them; ``test`` the 1,000 real, unshifted ones.
    """
    from tfdist.data.stage import as_images

    with np.load(full_size_mnist()) as npz:
        arrays = {key: npz[key] for key in npz.files}
    if split == "test":
        return Split(*as_images(arrays["x_test"], arrays["y_test"], "full size"))
    x, y = as_images(arrays["x_train"], arrays["y_train"], "full size")
    return Split(x, y) if split == "train" else Split(x[:1000], y[:1000])


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


def step_ms(report: dict) -> float:
    """A train report's steady step, in milliseconds: its steady epoch over the steps in an epoch."""
    return 1000 * report["steady_epoch_seconds"] / report["steps_per_epoch"]


def accuracy(model: Any, test: Split | PreparedSplit) -> float:
    test = test.read() if isinstance(test, PreparedSplit) else test
    probabilities = model.predict(scaled(test.x), batch_size=1024, verbose=0)
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


def pinned(command: list[str], cpus: set[int] | None) -> list[str]:
    """``command`` under ``taskset`` on ``cpus`` (None: as it is, unpinned)."""
    return ["taskset", "-c", ",".join(map(str, sorted(cpus))), *command] if cpus else command


def in_own_process(module: str, call: str, timeout: float = 900) -> Any:
    """The value of ``call`` (a Python expression over ``module``'s names, JSON-able) run in a fresh interpreter.

    For a cell that must not share this process's TensorFlow: thread pools,
    oneDNN and devices are fixed once TensorFlow runs its first op.
    """
    code = f"import json; from {module} import *; print(json.dumps({call}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=timeout).stdout
    return json.loads(out.strip().splitlines()[-1])


#: Where a benchmark's two probe processes run: each on a CPU of its own, or wherever the kernel puts them.
PLACEMENTS = ("a CPU each", "unpinned")


def placed(command: list[str], placement: str, cpus: set[int]) -> list[str]:
    """``command`` on ``cpus`` when ``placement`` pins it (:data:`PLACEMENTS`), else as it is."""
    return pinned(command, cpus if placement == PLACEMENTS[0] else None)


def probe_costs(small: dict, large: dict) -> dict[str, float]:
    """Two timed probes (``{"bytes", "seconds"}``) split into a latency and a cost per further byte."""
    per_byte = (large["seconds"] - small["seconds"]) / (large["bytes"] - small["bytes"])
    return {"latency_ms": 1e3 * small["seconds"], "large_ms": 1e3 * large["seconds"], "ns_per_byte": 1e9 * per_byte}


@contextlib.contextmanager
def tracking_server(store: str, artifacts: Path, env: dict[str, str] | None = None,
                    *options: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """``tfdist server`` on ``store`` on a free loopback port, until ``/health`` answers: its URL and process.

    The server and what it starts are one session, stopped together on the way out.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "tfdist_cli", "server", "--backend-store-uri", store,
                                "--port", str(port), "--artifacts-destination", str(artifacts), *options],
                               env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"error: no MLflow server came up at {url}") from None
                time.sleep(0.2)
        yield url, process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
