"""The prepared data: three splits of digits, their files, and their digest (no TensorFlow).

Prepared data is three ``.npz`` files (train, val, test) of float32 pixels in
[0, 1], flattened to 784, and int64 labels. They are written once by the
preprocess stage (:mod:`tfdist.data.stage`) and read, validated, by every later
stage; the input pipeline that feeds them to TensorFlow is :mod:`tfdist.train.input_pipeline`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfdist import atomic
from tfdist.errors import InputError

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


def save_prepared(data: PreparedData, out_dir: Path, *, outputs: atomic.Outputs | None = None) -> None:
    """Write ``train.npz``, ``val.npz``, ``test.npz`` into ``out_dir``, all or nothing (with ``outputs``: staged there)."""
    with contextlib.ExitStack() as stack:
        if outputs is None:
            outputs = stack.enter_context(atomic.atomic_outputs())
        size = sum(split.x.nbytes + split.y.nbytes + 1024 for split in data.splits().values())  # + npz headers
        tmp = outputs.stage(out_dir, size=size)
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


def splits_digest(splits: dict[str, Digits]) -> str:
    """SHA-256 of the splits' pixels and labels, in ``SPLITS`` order: names the prepared data."""
    sha = hashlib.sha256()
    for name in SPLITS:
        sha.update(np.ascontiguousarray(splits[name].x).tobytes())
        sha.update(np.ascontiguousarray(splits[name].y.astype(np.int64)).tobytes())
    return sha.hexdigest()


