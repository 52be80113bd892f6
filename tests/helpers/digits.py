"""Fake MNIST digits and IDX files, for the data tests: no download, shapes and bytes as the real ones have."""

from __future__ import annotations

import gzip
import struct

import numpy as np


def fake_mnist(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), np.arange(n, dtype=np.uint8) % 10


def write_idx(path, array: np.ndarray, compress: bool) -> None:
    magic = 0x0800 | array.ndim
    data = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    (gzip.open if compress else open)(path, "wb").write(data)
