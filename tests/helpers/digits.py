"""Fake MNIST digits and IDX files, for the data tests: no download, shapes and bytes as the real ones have."""

from __future__ import annotations

import gzip
import struct

import numpy as np

from tfdist.data.prepared import MNIST_CLASSES, DataSpec

#: MNIST's images and classes, what the tests' models are built for.
MNIST = DataSpec("MNIST", (28, 28, 1), MNIST_CLASSES)


def fake_mnist(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), np.arange(n, dtype=np.uint8) % 10


def write_idx(path, array: np.ndarray, compress: bool) -> None:
    magic = 0x0800 | array.ndim
    data = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    (gzip.open if compress else open)(path, "wb").write(data)


def colour_set(n: int, classes: int = 3, size: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable set of ``n`` colour images, ``size`` x ``size`` x 3 uint8: class k is brightest in channel k % 3,
    its stripes at an angle of its own (so more than 3 classes still tell apart), with noise."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % classes
    rows, cols = np.mgrid[0:size, 0:size]
    images = rng.integers(0, 60, (n, size, size, 3)).astype(np.int64)
    for label in range(classes):
        stripes = ((rows + (label + 1) * cols) // 3) % 2 == 0
        images[labels == label, :, :, label % 3] += 140 + 60 * stripes
    return np.clip(images, 0, 255).astype(np.uint8), labels


def image_folder(root, counts: dict[str, int], size: tuple[int, int] = (16, 16)):
    """A folder of PNGs, a subfolder per class (``counts``: class name -> images), from :func:`colour_set`; its path."""
    from PIL import Image

    x, y = colour_set(sum(counts.values()) * len(counts), classes=len(counts), size=max(size))
    for label, (name, count) in enumerate(counts.items()):
        (root / name).mkdir(parents=True)
        for index, image in enumerate(x[y == label][:count]):
            Image.fromarray(image[:size[0], :size[1]]).save(root / name / f"{index}.png")
    return root
