"""A folder of images with one subfolder per class, read as Keras's ``image_dataset_from_directory`` reads it.

The class names are the subfolders' names, in sorted order (label ``i`` is the
``i``-th); every PNG or JPEG file in a class folder is one image of it. Images
keep their channels (greyscale 1, RGB 3, RGBA 4); all must have the same, and
the same size unless ``data.image_size`` resizes them. Anything else in a class
folder is named in an error: tfdist never trains on less than the user gave it
without saying so. Hidden files (``.DS_Store``...) are passed over.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from tfdist.errors import InputError

#: The image formats a class folder may hold.
FORMATS = ("PNG", "JPEG")
#: PIL's modes, as the channels they are read with (a palette image is read as RGB, a 1-bit one as greyscale).
_MODES = {"1": ("L", 1), "L": ("L", 1), "P": ("RGB", 3), "RGB": ("RGB", 3), "RGBA": ("RGBA", 4), "LA": ("LA", 2)}


def load_image_folder(folder: Path, image_size: tuple[int, int] | None = None
                      ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Every image of every class folder under ``folder``, labelled by its folder: images, labels, class names.

    Args:
        image_size: ``(height, width)`` every image is resized to (bilinear); None keeps
            their size, which must then be the same for all.

    Raises:
        InputError: one line naming the folder or file: no class folders, fewer than 2, an
            empty one, a file that is not a PNG or JPEG image, images whose channels or (without
            ``image_size``) sizes differ (two files named).
    """
    classes = sorted(path for path in folder.iterdir() if path.is_dir() and not path.name.startswith("."))
    if len(classes) < 2:
        found = f"only {classes[0].name}/" if classes else "none"
        raise InputError(f"data.source: {folder} needs a subfolder of images per class, at least 2 ({found}); "
                         "or give an .npz file or a folder of IDX files")
    images, labels, first = [], [], None
    for label, class_folder in enumerate(classes):
        files = sorted(path for path in class_folder.iterdir() if not path.name.startswith("."))
        if not files:
            raise InputError(f"data.source: class folder {class_folder} is empty; put its images in it or remove it")
        for path in files:
            pixels = _read(path, image_size)
            if first is None:
                first = (path, pixels.shape)
            elif pixels.shape != first[1]:
                raise InputError(_mismatch(first, path, pixels.shape))
            images.append(pixels)
            labels.append(label)
    return np.stack(images), np.asarray(labels, dtype=np.int64), tuple(path.name for path in classes)


def _read(path: Path, image_size: tuple[int, int] | None) -> np.ndarray:
    """One image as uint8 ``(height, width, channels)``."""
    if path.is_dir():
        raise InputError(f"data.source: {path} is a folder inside a class folder; a class folder holds only images")
    try:
        with Image.open(path) as image:
            if image.format not in FORMATS:
                raise InputError(f"data.source: {path} is a {image.format} image; use PNG or JPEG")
            mode, channels = _MODES.get(image.mode, (None, 0))
            if mode is None:
                raise InputError(f"data.source: {path} has pixels of mode {image.mode}; use 8-bit greyscale, RGB or "
                                 "RGBA")
            image = image.convert(mode)
            if image_size is not None:
                image = image.resize((image_size[1], image_size[0]), Image.Resampling.BILINEAR)
            pixels = np.asarray(image, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise InputError(f"data.source: {path} is not an image tfdist can read (PNG or JPEG): {err}") from None
    return pixels.reshape(*pixels.shape[:2], channels)


def _mismatch(first: tuple[Path, tuple[int, ...]], path: Path, shape: tuple[int, ...]) -> str:
    (first_path, first_shape) = first
    if first_shape[2] != shape[2]:
        return (f"data.source: {first_path} has {first_shape[2]} channel(s) and {path} {shape[2]}; "
                "make every image greyscale, or every one RGB")
    return (f"data.source: {first_path} is {first_shape[1]}x{first_shape[0]} pixels and {path} {shape[1]}x{shape[0]}; "
            "set data.image_size: [height, width] to resize them all")
