"""The prepared files: what the preprocess stage writes is what later stages read, and bad files are named."""

import json

import numpy as np
import pytest

from tfdist.config.knobs import DataConfig
from tfdist.data.prepared import MIN_SHARDS, load_spec, load_split, prepared_digest, shard_count
from tfdist.data.sources import RawImages
from tfdist.data.stage import write_prepared
from tfdist.errors import InputError

from helpers.digits import fake_mnist


def test_prepared_roundtrip_and_validation(tmp_path):
    x, y = fake_mnist(300)
    summary = write_prepared(RawImages("t", x, y), DataConfig(), 0, tmp_path / "prepared")
    names = sorted(p.name for p in (tmp_path / "prepared").iterdir())
    assert "spec.json" in names and len(names) == 1 + 3 * MIN_SHARDS
    assert "train-00000-of-00016.tfrecord" in names
    spec = load_spec(tmp_path / "prepared")
    assert spec.features == 784 and spec.classes == 10
    splits = {name: load_split(tmp_path / "prepared", name, spec) for name in ("train", "val", "test")}
    assert sum(len(split) for split in splits.values()) == 300
    assert summary["sha256"] == prepared_digest(tmp_path / "prepared")
    back = {name: split.read() for name, split in splits.items()}
    pixels = {image.tobytes(): label for image, label in zip(x, y, strict=True)}
    for split in back.values():  # every image written once, with its own label
        assert split.x.dtype == np.uint8 and split.features().shape == (len(split), 784), "pixels kept as bytes"
        assert all(pixels[image.tobytes()] == label for image, label in zip(split.x, split.y, strict=True))
    assert len({image.tobytes() for split in back.values() for image in split.x}) == 300
    assert back["train"].y[:50].tolist() != sorted(back["train"].y[:50].tolist()), "written in a random order"
    other = type(spec)("other", (32, 32, 3), spec.class_names)
    with pytest.raises(InputError, match=r"describes t \(28x28x1, 10 classes\), not images of other \(32x32x3"):
        load_split(tmp_path / "prepared", "train", other)
    shard = tmp_path / "prepared" / "val-00003-of-00016.tfrecord"
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(InputError, match=r"val-00003-of-00016.tfrecord has \d+ bytes, \d+ when written; rerun"):
        load_split(tmp_path / "prepared", "val", spec)
    shard.unlink()
    with pytest.raises(InputError, match="val-00003-of-00016.tfrecord not found; run the preprocess stage first"):
        load_split(tmp_path / "prepared", "val", spec)
    with pytest.raises(InputError, match="spec.json not found; run the preprocess stage"):
        load_split(tmp_path / "missing", "train", spec)
    with pytest.raises(InputError, match="spec.json not found; run the preprocess stage"):
        load_spec(tmp_path / "missing")


def test_tensorflow_reads_the_shards_as_written(tmp_path):
    """TensorFlow's TFRecordDataset checks every frame's CRC and the input's decoder gives the pixels back, scaled."""
    from tfdist.data.input_pipeline import make_ordered
    from tfdist.tf_imports import tf

    x, y = fake_mnist(200)
    write_prepared(RawImages("t", x, y), DataConfig(), 0, tmp_path / "prepared")
    spec = load_spec(tmp_path / "prepared")
    test = load_split(tmp_path / "prepared", "test", spec)
    held = test.read()
    streamed = list(make_ordered(test, 7).as_numpy_iterator())
    np.testing.assert_array_equal(np.concatenate([b for _, b in streamed]), held.y)
    np.testing.assert_allclose(np.concatenate([a for a, _ in streamed]), held.features() / 255.0, rtol=1e-6)
    assert tf.data.TFRecordDataset([str(p) for p in test.paths]).reduce(0, lambda n, _: n + 1).numpy() == len(test)


def test_decoding_in_chunks_gives_the_batches_of_decoding_each(tmp_path, monkeypatch):
    """Records decoded hundreds at a time and cut into batches are the batches decoded one by one would be: the same
    images in the same order, the remainder dropped."""
    from tfdist.data import input_pipeline
    from tfdist.tf_imports import tf

    x, y = fake_mnist(400)
    write_prepared(RawImages("t", x, y), DataConfig(), 0, tmp_path / "prepared")
    spec = load_spec(tmp_path / "prepared")
    train = load_split(tmp_path / "prepared", "train", spec)
    monkeypatch.setattr(input_pipeline, "DECODE_RECORDS", 30)  # 4 batches of 7 a chunk: a chunk ends mid-epoch
    assert input_pipeline.decode_chunk(spec, 7) == 28 and input_pipeline.decode_chunk(spec, 50) == 50
    each = input_pipeline.decoder(spec)
    records = tf.data.TFRecordDataset([str(p) for p in train.paths])
    one_by_one = list(records.batch(7, drop_remainder=True).map(each).as_numpy_iterator())
    chunked = list(input_pipeline._decoded(records.batch(7, drop_remainder=True), spec, 7).as_numpy_iterator())
    assert len(chunked) == len(one_by_one) == len(train) // 7 and len(train) % 7
    for (a, b), (c, d) in zip(one_by_one, chunked, strict=True):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)


def test_shard_count_grows_with_the_bytes_in_multiples_of_sixteen():
    mnist = load_spec_like((28, 28, 1))
    assert shard_count(5, mnist) == 5, "a file holds one image at least"
    assert shard_count(3_600, mnist) == MIN_SHARDS
    assert shard_count(600_000, mnist) == MIN_SHARDS, "470 MB: 16 files of 30 MB"
    assert shard_count(220_536, load_spec_like((64, 64, 3))) == 48, "2.5 GB: 48 files of at most 64 MB"


def load_spec_like(shape):
    from tfdist.data.prepared import DataSpec

    return DataSpec("t", shape, tuple("0123456789"))


def test_the_spec_lists_every_file_with_its_digest(tmp_path):
    x, y = fake_mnist(100)
    write_prepared(RawImages("t", x, y), DataConfig(), 0, tmp_path / "prepared")
    written = json.loads((tmp_path / "prepared" / "spec.json").read_text())
    files = written["splits"]["train"]["files"]
    assert len(files) == MIN_SHARDS and all(len(f["sha256"]) == 64 for f in files)
    assert sum(written["splits"][s]["records"] for s in ("train", "val", "test")) == 100
