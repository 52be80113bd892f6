"""The user's own TFRecord files as a source: ``tf.train.Example`` records of an encoded image and an integer label.

``data.source`` names one TFRecord file (``.tfrecord``, ``.tfrecords``,
``.tfrec``, sharded names such as ``train.tfrecord-00000-of-00008`` too) or a
folder of them; files whose name holds ``test`` are the test split, the rest
the training images. Each record's image is a PNG or JPEG in the bytes feature
``data.tfrecord.image_key`` (``image`` by default; TF-slim's sets call it
``image/encoded``) and its class an int64 ``data.tfrecord.label_key``
(``label``; ``image/class/label``). The files are read twice, in
order: the labels first (what the split is decided from), then the images,
decoded by a pool of processes a chunk at a time into a memory map in the
scratch folder, so no more than a chunk is in memory (:mod:`tfdist.data.images`).
Every record is checked: a CRC that fails, a record that is not an Example of
those features, an image that is not a PNG or JPEG, or one whose size or
channels differ from the first, is named by its file and its index.
"""

from __future__ import annotations

import io
import os
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from tfdist.data.image_folder import decode_image, mismatch
from tfdist.data.images import ArrayImages, FileRows
from tfdist.data.tfrecord import decode_example, read_records
from tfdist.errors import InputError

#: Records decoded at a time: 1,024 encoded images and their pixels, a few tens of MB.
RECORDS_A_CHUNK = 1024
#: What a TFRecord file's name looks like: ``x.tfrecord``, ``x.tfrecords``, ``x.tfrec``, ``x.tfrecord-00000-of-00008``.
NAME = re.compile(r"\.(tfrecords?|tfrec)(-\d+-of-\d+)?$")


def is_tfrecord_source(path: Path) -> bool:
    """Whether ``path`` is a TFRecord file, or a folder holding TFRecord files."""
    if path.is_dir():
        return any(NAME.search(child.name) for child in path.iterdir() if child.is_file())
    return bool(NAME.search(path.name))


def tfrecord_files(path: Path) -> tuple[list[Path], list[Path]]:
    """The source's training files and test files (names holding ``test``), each in name order."""
    files = sorted(child for child in path.iterdir() if child.is_file() and NAME.search(child.name)) \
        if path.is_dir() else [path]
    test = [file for file in files if "test" in file.name.lower()]
    train = [file for file in files if file not in test]
    if not train:
        raise InputError(f"data.source: {path} holds only test files ({', '.join(f.name for f in test)}); add the "
                         "training images' files (names without 'test')")
    return train, test


def read_tfrecords(files: list[Path], keys: tuple[str, str], image_size: tuple[int, int] | None, scratch: Path,
                   source: str) -> tuple[ArrayImages, np.ndarray]:
    """The images (a memory map in ``scratch``, checked as taken) and labels of ``files``' records."""
    image_key, label_key = keys
    labels = []
    for file in files:
        for index, payload in enumerate(read_records(file)):
            labels.append(decode_example(payload, image_key, label_key, f"data.source: {file}: record {index}")[1])
    if not labels:
        raise InputError(f"data.source: {', '.join(map(str, files))} hold no records")
    first: tuple[str, tuple[int, ...]] | None = None
    target = scratch / f"{Path(source).name}-{len(labels)}.u8"
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool, open(target, "wb") as out:
        for jobs in _chunks(files, keys, image_size, RECORDS_A_CHUNK):
            for (_, _, shown), image in zip(jobs, pool.map(_decode, jobs, chunksize=64), strict=True):
                if first is None:
                    first = (shown, image.shape)
                elif image.shape != first[1]:
                    raise InputError(mismatch(first, shown, image.shape))
                out.write(image.tobytes())
    assert first is not None
    return ArrayImages(FileRows(target, 0, (len(labels), *first[1]), np.dtype(np.uint8)), source), \
        np.asarray(labels, dtype=np.int64)


def _chunks(files: list[Path], keys: tuple[str, str], image_size: tuple[int, int] | None, size: int):  # noqa: ANN202
    """``[(an encoded image, the size to resize to, its name), ...]``, ``size`` records at a time, in order."""
    jobs = []
    for file in files:
        for index, payload in enumerate(read_records(file)):
            encoded, _ = decode_example(payload, *keys, f"data.source: {file}: record {index}")
            jobs.append((encoded, image_size, f"{file}: record {index}"))
            if len(jobs) == size:
                yield jobs
                jobs = []
    if jobs:
        yield jobs


def _decode(job: tuple[bytes, tuple[int, int] | None, str]) -> np.ndarray:
    encoded, image_size, shown = job
    return decode_image(io.BytesIO(encoded), image_size, shown)
