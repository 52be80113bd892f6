"""The prepared data: three splits of images as TFRecord shards, what they are (:class:`DataSpec`), and their digest.

Each split (train, val, test) is many TFRecord files (:data:`MIN_SHARDS` or
more), so each worker streams files of its own and no process ever holds a
split (:mod:`tfdist.data.input_pipeline`). A record is one image: its label
as 8 bytes (int64, little-endian), then its uint8 pixels, ``height x width x
channels`` of them: read a batch at a time with one ``decode_raw``, twice as
fast as parsing ``tf.train.Example`` records (docs/data.md). The preprocess
stage (:mod:`tfdist.data.stage`) writes the images of a split in a random order
and cuts it into shards, so every shard is a random sample of the split.
``spec.json`` says what the data is (name, shape, classes) and, per split, its
files, their records, bytes and SHA-256, and how many images of each class it
holds; every later stage reads it, and checks the files against it. No TensorFlow.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tfdist.data.tfrecord import RecordWriter, read_records
from tfdist.errors import InputError

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
#: What the prepared folder says of its data and files.
SPEC_FILE = "spec.json"
#: A record's label: int64, little-endian, before the pixels.
LABEL_BYTES = 8
#: Each split in at least this many files, a multiple of it: files enough for 16 workers, shares that come out even
#: for 1, 2, 4, 8 and 16 of them, and a shuffled file order that mixes an epoch however the records were written.
MIN_SHARDS = 16
#: A shard's size at most (more files beyond it): TensorFlow's guide asks 10 MB or more a file, read whole; 64 MB keeps
#: a 2.5 GB set in 48 files, each streamed in one pass.
SHARD_BYTES = 64 << 20


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

    @property
    def record_bytes(self) -> int:
        """One record's payload: the label's 8 bytes, then the pixels."""
        return LABEL_BYTES + self.features

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
    """Images held in memory: ``x`` uint8 ``(n, height, width, channels)``, ``y`` int64 ``(n,)`` labels.

    What a few records read back give (:meth:`PreparedSplit.read`), and what tests and benchmarks build data from.
    """

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
class Shard:
    """One file of a split: its name in the prepared folder, its records, bytes and SHA-256."""

    name: str
    records: int
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "records": self.records, "bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True)
class PreparedSplit:
    """One prepared split on disk: its shards, in order, and how many images of each class they hold.

    Attributes:
        name: train, val or test.
        folder: the prepared folder the shards are in.
        spec: what the images are.
        shards: the files, in the order written.
        per_class: images of each class (label order).
    """

    name: str
    folder: Path
    spec: DataSpec
    shards: tuple[Shard, ...]
    per_class: tuple[int, ...] = field(default=())

    def __len__(self) -> int:
        return sum(shard.records for shard in self.shards)

    @property
    def paths(self) -> list[Path]:
        return [self.folder / shard.name for shard in self.shards]

    def records(self, limit: int | None = None) -> Iterator[tuple[np.ndarray, int]]:
        """The images (uint8 ``(height, width, channels)``) and labels in file order, read without TensorFlow."""
        read = 0
        for path in self.paths:
            for payload in read_records(path):
                if limit is not None and read >= limit:
                    return
                yield decode_record(payload, self.spec, path), int.from_bytes(payload[:LABEL_BYTES], "little")
                read += 1

    def read(self, limit: int | None = None) -> Split:
        """The first ``limit`` images (all: only for a split known to be small) as arrays."""
        images, labels = [], []
        for image, label in self.records(limit):
            images.append(image)
            labels.append(label)
        return Split(np.stack(images).reshape(-1, *self.spec.shape), np.asarray(labels, dtype=np.int64))

    def to_json(self) -> dict[str, Any]:
        return {"records": len(self), "per_class": list(self.per_class), "files": [s.to_json() for s in self.shards]}


def decode_record(payload: bytes, spec: DataSpec, path: Path) -> np.ndarray:
    """A record's pixels, checked to be one image of ``spec``."""
    if len(payload) != spec.record_bytes:
        raise InputError(f"{path}: a record of {len(payload)} bytes, not {spec.record_bytes} (a label and "
                         f"{spec.features} pixels); rerun the preprocess stage")
    return np.frombuffer(payload, dtype=np.uint8, offset=LABEL_BYTES).reshape(spec.shape)


def encode_record(image: np.ndarray, label: int) -> bytes:
    """A record of one uint8 image and its label (:data:`LABEL_BYTES`, then the pixels)."""
    return int(label).to_bytes(LABEL_BYTES, "little") + np.ascontiguousarray(image, dtype=np.uint8).tobytes()


def shard_count(images: int, spec: DataSpec) -> int:
    """How many files a split of ``images`` takes: a multiple of :data:`MIN_SHARDS`, none over :data:`SHARD_BYTES`
    (fewer when there are fewer images than that: a file holds one image at least)."""
    by_size = math.ceil(images * (spec.record_bytes + 16) / SHARD_BYTES)
    return max(1, min(images, MIN_SHARDS * math.ceil(max(by_size, 1) / MIN_SHARDS)))


class SplitWriter:
    """Writes one split's images, in the order given, cut into :func:`shard_count` files (or ``shards``) of (nearly)
    equal records."""

    def __init__(self, name: str, folder: Path, spec: DataSpec, images: int, shards: int | None = None):
        self.name, self.folder, self.spec, self.images = name, folder, spec, images
        self.count = shards or shard_count(images, spec)
        self.per_class = np.zeros(spec.classes, dtype=np.int64)
        self.shards: list[Shard] = []
        self._writer: RecordWriter | None = None
        self._digest = hashlib.sha256()
        self._written = 0

    def _boundary(self, index: int) -> int:
        """The first image of shard ``index``: the images spread as evenly as they divide."""
        return index * self.images // self.count

    def write(self, images: np.ndarray, labels: np.ndarray) -> None:
        for image, label in zip(images, labels, strict=True):
            if self._writer is None or self._written == self._boundary(len(self.shards) + 1):
                self._close_shard()
                path = self.folder / f"{self.name}-{len(self.shards):05d}-of-{self.count:05d}.tfrecord"
                self._writer, self._digest = RecordWriter(path), hashlib.sha256()
            frame = self._writer.write(encode_record(image, int(label)))
            self._digest.update(frame)
            self.per_class[label] += 1
            self._written += 1

    def _close_shard(self) -> None:
        if self._writer is not None:
            self._writer.close()
            path = self._writer.path
            self.shards.append(Shard(path.name, self._writer.count, path.stat().st_size, self._digest.hexdigest()))
            self._writer = None

    def close(self) -> PreparedSplit:
        self._close_shard()
        assert self._written == self.images, f"{self.name}: {self._written} of {self.images} images written"
        return PreparedSplit(self.name, self.folder, self.spec, tuple(self.shards), tuple(int(n) for n in self.per_class))


def splits_digest(splits: dict[str, PreparedSplit]) -> str:
    """SHA-256 of the splits' files (each by its own SHA-256), in ``SPLITS`` order: names the prepared data."""
    sha = hashlib.sha256()
    for name in SPLITS:
        for shard in splits[name].shards:
            sha.update(shard.sha256.encode())
    return sha.hexdigest()


def write_spec(folder: Path, spec: DataSpec, splits: dict[str, PreparedSplit]) -> str:
    """Write ``spec.json``: what the data is, each split's files and counts, and their digest (returned)."""
    digest = splits_digest(splits)
    document = {**spec.to_json(), "record": f"int64 label (little-endian), then {'x'.join(map(str, spec.shape))} "
                                           "uint8 pixels", "sha256": digest,
                "splits": {name: splits[name].to_json() for name in SPLITS}}
    (folder / SPEC_FILE).write_text(json.dumps(document, indent=1) + "\n")
    return digest


def _read_spec(prepared_dir: Path) -> tuple[dict[str, Any], Path]:
    path = Path(prepared_dir) / SPEC_FILE
    try:
        return json.loads(path.read_text()), path
    except FileNotFoundError:
        raise InputError(f"{path} not found; run the preprocess stage (dvc repro preprocess)") from None
    except (OSError, json.JSONDecodeError) as err:
        raise InputError(f"{path} is unreadable ({err}); rerun the preprocess stage") from None


def load_spec(prepared_dir: Path) -> DataSpec:
    """What the prepared data is: its ``spec.json``.

    Raises:
        InputError: missing (prepared by an older tfdist, or not at all) or unreadable.
    """
    data, path = _read_spec(prepared_dir)
    return DataSpec.from_json(data, str(path))


def prepared_digest(prepared_dir: Path) -> str:
    """The prepared data's SHA-256, as ``spec.json`` (and ``reports/data.json``) give it."""
    data, path = _read_spec(prepared_dir)
    if not isinstance(data.get("sha256"), str):
        raise InputError(f"{path} has no sha256; rerun the preprocess stage")
    return data["sha256"]


def load_split(prepared_dir: Path, name: str, spec: DataSpec) -> PreparedSplit:
    """One prepared split, its files checked against ``spec.json`` (present, of the size it gives) and ``spec``.

    Raises:
        InputError: the spec or a file is missing, or a file's size is not the one written (a damaged copy).
    """
    data, path = _read_spec(prepared_dir)
    written = DataSpec.from_json(data, str(path))
    if (written.shape, written.classes) != (spec.shape, spec.classes):
        raise InputError(f"{path} describes {written.describe()}, not images of {spec.describe()}; rerun the "
                         "preprocess stage")
    try:
        split = data["splits"][name]
        shards = tuple(Shard(str(s["name"]), int(s["records"]), int(s["bytes"]), str(s["sha256"])) for s in split["files"])
        per_class = tuple(int(n) for n in split.get("per_class", ()))
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"{path}: no files of split {name} ({type(err).__name__}: {err}); rerun the preprocess stage "
                         "(dvc repro preprocess)") from None
    for shard in shards:
        file = Path(prepared_dir) / shard.name
        if not file.is_file():
            raise InputError(f"{file} not found; run the preprocess stage first (dvc repro preprocess)")
        if file.stat().st_size != shard.bytes:
            raise InputError(f"{file} has {file.stat().st_size} bytes, {shard.bytes} when written; rerun the "
                             "preprocess stage (dvc repro preprocess)")
    if not shards or sum(s.records for s in shards) == 0:
        raise InputError(f"{path}: split {name} holds no images; rerun the preprocess stage")
    return PreparedSplit(name, Path(prepared_dir), spec, shards, per_class)
