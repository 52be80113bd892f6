"""A source's images, read a chunk at a time: the preprocess stage's memory is a chunk's, whatever the source's size.

A source gives its images as :class:`Images`: how many, and ``take(indices)``,
those images as checked uint8 ``(k, height, width, channels)``. Arrays (an
``.npz``'s, an IDX file's, the sample's) are read through a memory map where
the file allows it (:mod:`tfdist.data.sources`), and checked and converted
chunk by chunk here; an image folder decodes its files as they are taken
(:mod:`tfdist.data.image_folder`).
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Protocol

import numpy as np

from tfdist.errors import InputError

#: Images read, checked and written at a time, at most: 8,192 of 28x28 are 6 MB.
CHUNK = 8192
#: The bytes of a chunk's pixels, at most (fewer images a chunk when they are large): 64x64x3 images 2,730 a chunk.
CHUNK_BYTES = 32 << 20


def chunk_size(image_bytes: int) -> int:
    """Images a chunk holds: :data:`CHUNK`, fewer when that would be more than :data:`CHUNK_BYTES`."""
    return max(1, min(CHUNK, CHUNK_BYTES // max(image_bytes, 1)))


class Images(Protocol):
    """Images of a source, by index."""

    source: str

    def __len__(self) -> int: ...

    def take(self, indices: np.ndarray) -> np.ndarray:
        """The images at ``indices``, uint8 ``(k, height, width, channels)``, in that order."""
        ...


class ArrayImages:
    """An array's images (``(N, height, width[, channels])`` numbers, a memory map or in memory), checked as taken.

    Pixels may be uint8 (or any integers) in 0..255, or floats in 0..255 or
    in 0..1 (scaled up: decided by one pass over the floats, a chunk at a time).

    Raises:
        InputError: not images, NaN or infinite pixels, pixels out of range (the image named).
    """

    def __init__(self, x: np.ndarray | FileRows, source: str):
        self.x, self.source = x, source
        if x.ndim not in (3, 4) or len(x) == 0 or not np.issubdtype(x.dtype, np.number):
            raise InputError(f"{source}: x must be images, (N, height, width) or (N, height, width, channels) "
                             f"numbers, got {x.dtype} {x.shape}")
        self.image_shape = (*x.shape[1:3], x.shape[3] if x.ndim == 4 else 1)
        self.scale = 1.0
        if np.issubdtype(x.dtype, np.floating):
            step = chunk_size(int(np.prod(x.shape[1:])) * x.dtype.itemsize)
            top = max(self._checked(start, x[start:start + step]).max() for start in range(0, len(x), step))
            self.scale = 255.0 if top <= 1 else 1.0

    def __len__(self) -> int:
        return len(self.x)

    def _checked(self, start: int, chunk: np.ndarray) -> np.ndarray:
        """``chunk`` (images ``start``...) with its non-finite and out-of-range pixels refused, naming the first."""
        flat = chunk.reshape(len(chunk), -1)
        if np.issubdtype(chunk.dtype, np.floating) and not np.isfinite(flat).all():
            bad = start + int(np.argmax(~np.isfinite(flat).all(axis=1)))
            raise InputError(f"{self.source}: image {bad} has NaN or infinite pixels")
        return flat

    def take(self, indices: np.ndarray) -> np.ndarray:
        order = np.argsort(indices, kind="stable")  # a memory map read in file order
        chunk = np.empty((len(indices), *self.x.shape[1:]), dtype=self.x.dtype)
        chunk[order] = self.x[indices[order]]
        flat = self._checked(int(indices.min()) if len(indices) else 0, chunk)
        if flat.dtype == np.uint8:
            return chunk.reshape(len(indices), *self.image_shape)
        if self.scale != 1.0:
            flat = flat * np.float32(self.scale)
        low, high = (flat.min(), flat.max()) if len(flat) else (0, 0)
        if low < 0 or high > 255:
            bad = int(indices[np.argmax(((flat < 0) | (flat > 255)).any(axis=1))])
            raise InputError(f"{self.source}: pixels must be in 0..255 (or floats in 0..1), found {low:g}..{high:g} "
                             f"(image {bad})")
        pixels = flat if flat.dtype == np.uint8 else np.rint(flat).astype(np.uint8)
        return pixels.reshape(len(indices), *self.image_shape)


class FileRows:
    """An array stored in a file (C order, from ``offset``), its rows read as they are indexed: by ``pread``, into this
    process's memory and no further. (A memory map would do, but the kernel maps its read-ahead into the process
    with every page a scattered read faults in: 2,730 images of 12 KB taken at random held 350 MB.)"""

    def __init__(self, path: Path, offset: int, shape: tuple[int, ...], dtype: np.dtype):
        self.path, self.offset, self.shape, self.dtype = path, offset, tuple(shape), np.dtype(dtype)
        self.ndim = len(self.shape)
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self._fd = os.open(path, os.O_RDONLY)
        self.close = weakref.finalize(self, os.close, self._fd)  # closed with the array (or by ``close()``)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: slice | np.ndarray) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, _ = key.indices(len(self))
            data = os.pread(self._fd, (stop - start) * self.row_bytes, self.offset + start * self.row_bytes)
            return np.frombuffer(data, dtype=self.dtype).reshape(-1, *self.shape[1:])
        rows = np.empty((len(key), *self.shape[1:]), dtype=self.dtype)
        flat = rows.reshape(len(key), -1).view(np.uint8)
        for i, index in enumerate(np.asarray(key)):
            flat[i] = np.frombuffer(os.pread(self._fd, self.row_bytes, self.offset + int(index) * self.row_bytes),
                                    dtype=np.uint8)
        return rows


def checked_labels(y: np.ndarray, count: int, source: str) -> np.ndarray:
    """Labels as int32 (4 bytes an image: a 600,000-image set's labels are 2.4 MB), one per image, whole numbers >= 0.

    Raises:
        InputError: x and y of different lengths, labels that are not whole numbers >= 0.
    """
    y = np.asarray(y)
    if y.ndim != 1 or count != len(y):
        raise InputError(f"{source}: x holds {count} images and y {np.shape(y)} labels; give one label per image")
    if len(y) and not np.issubdtype(y.dtype, np.integer) and not (
            np.issubdtype(y.dtype, np.number) and np.all(np.mod(y, 1) == 0)):
        raise InputError(f"{source}: labels must be whole numbers 0..K-1, got {y.dtype} values such as {y[0]!r}")
    if len(y) and y.min() < 0:
        raise InputError(f"{source}: labels must be 0..K-1, found {y.min():g}")
    if len(y) and y.max() >= 2**31:
        raise InputError(f"{source}: labels must be 0..K-1 for K classes, found {y.max():g}")
    return y.astype(np.int32, copy=False)


def as_images(x: np.ndarray, y: np.ndarray, source: str) -> tuple[np.ndarray, np.ndarray]:
    """In-memory images and labels, checked and converted whole: uint8 ``(N, height, width, channels)``, int64."""
    x = np.asarray(x)
    labels = checked_labels(y, len(x), source)
    images = ArrayImages(x, source)
    return images.take(np.arange(len(images))), labels.astype(np.int64)
