"""The prepared data: three splits of images, what they are (:class:`DataSpec`), their files and digest (no TensorFlow).

Prepared data is three ``.npz`` files (train, val, test) of uint8 pixels,
``(N, height, width, channels)``, and int64 labels 0..K-1, beside
``spec.json``: the data set's name, the images' shape and the classes' names.
Pixels stay uint8 (a quarter of float32) until the input pipeline scales
each batch (:func:`scaled`), so a large set is held once, in bytes. They are
written once by the preprocess stage (:mod:`tfdist.data.stage`) and read,
validated, by every later stage; the input pipeline that feeds them to
TensorFlow is :mod:`tfdist.train.input_pipeline`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfdist.errors import InputError
from tfdist.files import atomic

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
#: What the prepared folder says of its data, beside the splits.
SPEC_FILE = "spec.json"


@dataclass(frozen=True)
class DataSpec:
    """What the models are built for and the reports speak of: the data set, its images' shape, its classes.

    Attributes:
        name: the data set as the reports name it (``MNIST``, ``MNIST sample``, a file or folder's name).
        shape: one image, ``(height, width, channels)``.
        class_names: the classes, in label order (label ``i`` is ``class_names[i]``).
    """

    name: str
    shape: tuple[int, int, int]
    class_names: tuple[str, ...]

    @property
    def features(self) -> int:
        """The pixels of one image, flattened: what a model's input takes."""
        return math.prod(self.shape)

    @property
    def classes(self) -> int:
        return len(self.class_names)

    def describe(self) -> str:
        """``MNIST (28x28x1, 10 classes)``: the data set in a report's words."""
        height, width, channels = self.shape
        return f"{self.name} ({height}x{width}x{channels}, {self.classes} classes)"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "class_names": list(self.class_names)}

    @classmethod
    def from_json(cls, data: Any, source: str) -> DataSpec:
        """Read one back, checked (``source`` names the file in the error)."""
        try:
            shape = tuple(int(n) for n in data["shape"])
            spec = cls(str(data["name"]), shape, tuple(str(c) for c in data["class_names"]))  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError) as err:
            raise InputError(f"{source}: not a data spec ({type(err).__name__}: {err}); rerun the preprocess stage") \
                from None
        if len(spec.shape) != 3 or min(spec.shape) < 1 or spec.classes < 2:
            raise InputError(f"{source}: shape {spec.shape} with {spec.classes} classes; rerun the preprocess stage")
        return spec


#: MNIST's digits, as the bundled sample, Keras's copy and the IDX files give them.
MNIST_CLASSES = tuple(str(digit) for digit in range(10))


@dataclass(frozen=True)
class Split:
    """One split: ``x`` uint8 ``(n, height, width, channels)``, ``y`` int64 ``(n,)`` labels."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def features(self) -> np.ndarray:
        """The images flattened to one row each, still uint8 (a view, no copy): the models' input layout."""
        return self.x.reshape(len(self.x), -1)


def scaled(pixels: np.ndarray) -> np.ndarray:
    """uint8 pixels as the models take them: float32 in [0, 1], one flat row per image."""
    return (pixels.reshape(len(pixels), -1).astype(np.float32) / np.float32(255.0))


@dataclass(frozen=True)
class PreparedData:
    """The three splits and what they are."""

    spec: DataSpec
    train: Split
    val: Split
    test: Split

    def splits(self) -> dict[str, Split]:
        return {"train": self.train, "val": self.val, "test": self.test}


def save_prepared(data: PreparedData, out_dir: Path, *, outputs: atomic.Outputs | None = None) -> None:
    """Write the three splits and ``spec.json`` into ``out_dir``, all or nothing (with ``outputs``: staged there)."""
    with contextlib.ExitStack() as stack:
        if outputs is None:
            outputs = stack.enter_context(atomic.atomic_outputs())
        size = sum(split.x.nbytes + split.y.nbytes + 1024 for split in data.splits().values())  # + npz headers
        tmp = outputs.stage(out_dir, size=size)
        tmp.mkdir()
        for name, split in data.splits().items():
            np.savez(tmp / f"{name}.npz", x=split.x, y=split.y)
        (tmp / SPEC_FILE).write_text(json.dumps(data.spec.to_json(), indent=2) + "\n")


def load_spec(prepared_dir: Path) -> DataSpec:
    """What the prepared data is: its ``spec.json``.

    Raises:
        InputError: missing (prepared by an older tfdist, or not at all) or unreadable.
    """
    path = Path(prepared_dir) / SPEC_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path} not found; run the preprocess stage (dvc repro preprocess)") from None
    except (OSError, json.JSONDecodeError) as err:
        raise InputError(f"{path} is unreadable ({err}); rerun the preprocess stage") from None
    return DataSpec.from_json(data, str(path))


def load_split(prepared_dir: Path, name: str, spec: DataSpec) -> Split:
    """Read and check one prepared split against ``spec``.

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
    if x.dtype != np.uint8 or x.shape[1:] != spec.shape or y.shape != (len(x),):
        raise InputError(f"{path}: expected uint8 images of shape (N, {', '.join(map(str, spec.shape))}) and N labels, "
                         f"got {x.dtype} {x.shape} and {y.shape}; rerun the preprocess stage")
    if len(x) == 0 or y.min() < 0 or y.max() >= spec.classes:
        raise InputError(f"{path}: labels must be in 0..{spec.classes - 1} (and the split non-empty)")
    return Split(x, y.astype(np.int64))


def splits_digest(splits: dict[str, Split]) -> str:
    """SHA-256 of the splits' pixels and labels, in ``SPLITS`` order: names the prepared data."""
    sha = hashlib.sha256()
    for name in SPLITS:
        sha.update(np.ascontiguousarray(splits[name].x).tobytes())
        sha.update(np.ascontiguousarray(splits[name].y.astype(np.int64)).tobytes())
    return sha.hexdigest()
