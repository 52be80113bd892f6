"""TFRecord files written and read without TensorFlow: TensorFlow reads what tfdist writes, and the other way round."""

import numpy as np
import pytest

from tfdist.data.tfrecord import RecordWriter, decode_example, encode_example, read_records
from tfdist.errors import InputError


def test_records_round_trip_through_tensorflow(tmp_path):
    from tfdist.tf_imports import tf

    payloads = [bytes([i]) * i for i in range(1, 40)]
    writer = RecordWriter(tmp_path / "ours.tfrecord")
    for payload in payloads:
        writer.write(payload)
    writer.close()
    assert [bytes(r) for r in tf.data.TFRecordDataset(str(tmp_path / "ours.tfrecord")).as_numpy_iterator()] == payloads
    with tf.io.TFRecordWriter(str(tmp_path / "theirs.tfrecord")) as theirs:
        for image, label in ((b"\x89PNG", 3), (b"\xff\xd8", 7)):
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}))
            theirs.write(example.SerializeToString())
    read = [decode_example(r, "image", "label", "record") for r in read_records(tmp_path / "theirs.tfrecord")]
    assert read == [(b"\x89PNG", 3), (b"\xff\xd8", 7)]
    parsed = tf.io.parse_single_example(encode_example(b"abc", 5), {
        "image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)})
    assert (parsed["image"].numpy(), int(parsed["label"])) == (b"abc", 5)


def test_damaged_records_are_named_by_file_and_index(tmp_path):
    path = tmp_path / "d.tfrecord"
    writer = RecordWriter(path)
    for i in range(3):
        writer.write(np.full(100, i, dtype=np.uint8).tobytes())
    writer.close()
    data = bytearray(path.read_bytes())
    data[116 + 16 + 50] ^= 1  # the second record's payload
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"d.tfrecord: record 1 fails its CRC; the file is damaged"):
        list(read_records(path))
    path.write_bytes(bytes(data[:116 + 40]))
    with pytest.raises(InputError, match=r"d.tfrecord: record 1 is cut short \(28 of 100 bytes\)"):
        list(read_records(path))
    with pytest.raises(InputError, match=r"record 0 has no feature label \(it has class, image\); set data.tfrecord"):
        decode_example(encode_example(b"x", 1, label_key="class"), "image", "label", "record 0")
