"""A folder of images with one subfolder per class, read as Keras's ``image_dataset_from_directory`` reads it.

The class names are the subfolders' names, in sorted order (label ``i`` is the
``i``-th); every PNG or JPEG file in a class folder is one image of it. Images
keep their channels (greyscale 1, RGB 3, RGBA 4); all must have the same, and
the same size unless ``data.image_size`` resizes them. Anything else in a class
folder is named in an error: tfdist never trains on less than the user gave it
without saying so. Hidden files (``.DS_Store``...) are passed over.

The files are not trusted: an entry that is not a regular file (a pipe would
block the read for ever, a device would never end) or a link leaving the source
folder is refused by name, and an image's size is read from its header and held
to :data:`MAX_PIXELS` before a pixel is decoded.

The folder is listed first (the labels come from the folders' names); the
images are decoded only as the preprocess stage takes them, a chunk at a time,
by a pool of processes (one per core), so a folder larger than memory is read.
"""

from __future__ import annotations

import atexit
import os
import stat
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, UnidentifiedImageError

from tfdist.errors import InputError

#: The image formats a class folder may hold.
FORMATS = ("PNG", "JPEG")
#: The most pixels one image may declare (a 99-byte PNG can declare 20000x20000): 64 megapixels, far above any
#: image a classifier is trained on, far below what would exhaust memory once decoded.
MAX_PIXELS = 64_000_000
#: PIL's modes, as the channels they are read with (a palette image is read as RGB, a 1-bit one as greyscale).
_MODES = {"1": ("L", 1), "L": ("L", 1), "P": ("RGB", 3), "RGB": ("RGB", 3), "RGBA": ("RGBA", 4), "LA": ("LA", 2)}


class FolderImages:
    """The images of a folder with a subfolder per class, listed, each decoded as it is taken.

    Attributes:
        labels: each file's class (its folder's index among the sorted class folders).
        class_names: the class folders' names, sorted.
    """

    def __init__(self, folder: Path, paths: list[Path], labels: list[int], class_names: tuple[str, ...],
                 image_size: tuple[int, int] | None):
        self.source, self.root, self.paths = str(folder), folder.resolve(), paths
        self.labels, self.class_names, self.image_size = np.asarray(labels, dtype=np.int64), class_names, image_size
        self._first: tuple[Path, tuple[int, ...]] | None = None
        self._pool: ProcessPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def take(self, indices: np.ndarray) -> np.ndarray:
        """The images at ``indices``, decoded (by a process pool when there are many), their sizes held to the first's.

        Raises:
            InputError: a file that is not a readable PNG or JPEG image, or whose size or channels differ.
        """
        if self._first is None:  # every image held to the folder's first, as listed
            self._first = (self.paths[0], _decode((self.paths[0], self.root, self.image_size)).shape)
        paths = [self.paths[i] for i in indices]
        jobs = [(path, self.root, self.image_size) for path in paths]
        if len(jobs) > 64 and (os.cpu_count() or 1) > 1:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(os.cpu_count())
                atexit.register(self._pool.shutdown, cancel_futures=True)
            images = list(self._pool.map(_decode, jobs, chunksize=32))
        else:
            images = [_decode(job) for job in jobs]
        for path, pixels in zip(paths, images, strict=True):
            if pixels.shape != self._first[1]:
                raise InputError(mismatch(self._first, path, pixels.shape))
        return np.stack(images) if images else np.empty((0, 0, 0, 0), dtype=np.uint8)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def _decode(job: tuple[Path, Path, tuple[int, int] | None]) -> np.ndarray:
    path, root, image_size = job
    return _read(_inside(path, root), image_size, shown=path)


def image_folder(folder: Path, image_size: tuple[int, int] | None = None) -> FolderImages:
    """The images of every class folder under ``folder``, labelled by their folder, listed (not yet decoded).

    Args:
        image_size: ``(height, width)`` every image is resized to (bilinear); None keeps
            their size, which must then be the same for all.

    Raises:
        InputError: one line naming the folder or file: no class folders, fewer than 2, an empty one.
    """
    root = folder.resolve()
    classes = sorted(path for path in folder.iterdir() if _inside(path, root).is_dir() and not path.name.startswith("."))
    if len(classes) < 2:
        found = f"only {classes[0].name}/" if classes else "none"
        raise InputError(f"data.source: {folder} needs a subfolder of images per class, at least 2 ({found}); "
                         "or give an .npz file or a folder of IDX files")
    paths, labels = [], []
    for label, class_folder in enumerate(classes):
        files = sorted(path for path in class_folder.iterdir() if not path.name.startswith("."))
        if not files:
            raise InputError(f"data.source: class folder {class_folder} is empty; put its images in it or remove it")
        paths.extend(files)
        labels.extend([label] * len(files))
    return FolderImages(folder, paths, labels, tuple(path.name for path in classes), image_size)


def load_image_folder(folder: Path, image_size: tuple[int, int] | None = None
                      ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Every image of a (small) folder decoded into memory: images, labels, class names (:func:`image_folder`).

    Raises:
        InputError: as :func:`image_folder` and :meth:`FolderImages.take`.
    """
    images = image_folder(folder, image_size)
    try:
        return images.take(np.arange(len(images))), images.labels, images.class_names
    finally:
        images.close()


def _inside(path: Path, root: Path) -> Path:
    """``path`` with its links followed, refused when they lead out of the source folder ``root``."""
    target = path.resolve()
    if target != root and root not in target.parents:
        raise InputError(f"data.source: {path} links to {target}, outside {root}; copy the file into the folder")
    return target


def _read(path: Path, image_size: tuple[int, int] | None, shown: Path) -> np.ndarray:
    """One image as uint8 ``(height, width, channels)``; ``shown`` is how the user named it."""
    try:
        kind = path.stat().st_mode
    except OSError as err:
        raise InputError(f"data.source: {shown} cannot be read ({err.strerror})") from None
    if stat.S_ISDIR(kind):
        raise InputError(f"data.source: {shown} is a folder inside a class folder; a class folder holds only images")
    if not stat.S_ISREG(kind):
        raise InputError(f"data.source: {shown} is not a regular file (a pipe, socket or device); a class folder "
                         "holds only images")
    return decode_image(path, image_size, shown)


def decode_image(encoded: Path | BinaryIO, image_size: tuple[int, int] | None, shown: str | Path) -> np.ndarray:
    """A PNG or JPEG image (a file, or its bytes) as uint8 ``(height, width, channels)``, its declared size held to
    :data:`MAX_PIXELS` before a pixel is decoded; ``shown`` names it in the error."""
    try:
        with Image.open(encoded) as image:
            if image.width * image.height > MAX_PIXELS:
                raise InputError(f"data.source: {shown} declares {image.width}x{image.height} pixels, more than "
                                 f"{MAX_PIXELS:,}; scale it down (data.image_size resizes only what can be read)")
            if image.format not in FORMATS:
                raise InputError(f"data.source: {shown} is a {image.format} image; use PNG or JPEG")
            mode, channels = _MODES.get(image.mode, (None, 0))
            if mode is None:
                raise InputError(f"data.source: {shown} has pixels of mode {image.mode}; use 8-bit greyscale, RGB or "
                                 "RGBA")
            image = image.convert(mode)
            if image_size is not None:
                image = image.resize((image_size[1], image_size[0]), Image.Resampling.BILINEAR)
            pixels = np.asarray(image, dtype=np.uint8)
    except Image.DecompressionBombError as err:  # PIL's own limit, checked as it opens: far past ours
        raise InputError(f"data.source: {shown} declares more pixels than {MAX_PIXELS:,} ({err}); scale it down") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise InputError(f"data.source: {shown} is not an image tfdist can read (PNG or JPEG): {err}") from None
    return pixels.reshape(*pixels.shape[:2], channels)


def mismatch(first: tuple[Path | str, tuple[int, ...]], path: Path | str, shape: tuple[int, ...]) -> str:
    """The error for two images whose channels or sizes differ, naming both."""
    (first_path, first_shape) = first
    if first_shape[2] != shape[2]:
        return (f"data.source: {first_path} has {first_shape[2]} channel(s) and {path} {shape[2]}; "
                "make every image greyscale, or every one RGB")
    return (f"data.source: {first_path} is {first_shape[1]}x{first_shape[0]} pixels and {path} {shape[1]}x{shape[0]}; "
            "set data.image_size: [height, width] to resize them all")
