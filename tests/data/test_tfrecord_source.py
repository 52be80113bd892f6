"""The user's own TFRecord files as a source: Examples of PNG/JPEG images and labels, split, checked record by record."""

import io

import numpy as np
from click.testing import CliRunner
from PIL import Image

from stages import preprocess as preprocess_stage
from tfdist.config.knobs import DataConfig, TFRecordConfig
from tfdist.data.prepared import SPLITS, load_spec, load_split
from tfdist.data.stage import prepare
from tfdist.data.tfrecord import RecordWriter, encode_example
from tfdist.data.tfrecord_source import is_tfrecord_source

from helpers.digits import colour_set
from helpers.project import REPO


def write_tfrecords(path, images, labels, image_key="image", label_key="label", fmt="PNG"):
    writer = RecordWriter(path)
    for image, label in zip(images, labels, strict=True):
        encoded = io.BytesIO()
        Image.fromarray(image).save(encoded, format=fmt)
        writer.write(encode_example(encoded.getvalue(), int(label), image_key, label_key))
    writer.close()


def test_a_folder_of_sharded_tfrecords_with_a_test_file_is_prepared(tmp_path):
    x, y = colour_set(90, classes=3)
    folder = tmp_path / "parts"
    folder.mkdir()
    write_tfrecords(folder / "train.tfrecord-00000-of-00002", x[:40], y[:40], "image/encoded", "image/class/label")
    write_tfrecords(folder / "train.tfrecord-00001-of-00002", x[40:75], y[40:75], "image/encoded", "image/class/label")
    write_tfrecords(folder / "parts-test.tfrecord", x[75:], y[75:], "image/encoded", "image/class/label")
    assert is_tfrecord_source(folder) and not is_tfrecord_source(tmp_path)
    config = DataConfig(source=str(folder), tfrecord=TFRecordConfig("image/encoded", "image/class/label"))
    summary = prepare(config, 0, tmp_path / "prepared")
    assert summary["source"] == "parts" and summary["shape"] == [16, 16, 3] and summary["class_names"] == ["0", "1", "2"]
    assert [summary["splits"][name]["total"] for name in SPLITS] == [69, 6, 15]
    spec = load_spec(tmp_path / "prepared")
    test = load_split(tmp_path / "prepared", "test", spec).read()
    assert {image.tobytes() for image in test.x} == {image.tobytes() for image in x[75:]}, "PNG is lossless"
    assert not list(tmp_path.glob(".prepared.scratch")), "the decoded images' memory map goes with the scratch folder"


def preprocess(tmp_path, source, *sets):
    return CliRunner().invoke(preprocess_stage.main, [
        "--params", str(REPO / "params.yaml"), "--set", f"data.source={source}",
        *(arg for item in sets for arg in ("--set", item)),
        "--out", str(tmp_path / "out" / "prepared"), "--report", str(tmp_path / "out" / "data.json")])


def refused(result, tmp_path):
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir()), "nothing written"
    (line,) = [line for line in result.output.splitlines() if line.startswith("error: ")]
    return line


def test_a_bad_record_in_the_middle_is_named_by_file_and_index(tmp_path):
    x, y = colour_set(60, classes=3)
    source = tmp_path / "set.tfrecord"
    write_tfrecords(source, x, y)
    assert "has no feature label (it has class, image); set data.tfrecord.image_key and label_key" in refused(
        preprocess(tmp_path, _relabelled(tmp_path, x, y)), tmp_path)
    data = bytearray(source.read_bytes())
    data[len(data) // 2] ^= 0xFF
    source.write_bytes(bytes(data))
    line = refused(preprocess(tmp_path, source), tmp_path)
    assert f"{source}: record 29 fails its CRC; the file is damaged" in line or f"{source}: record 30 fails" in line
    writer = RecordWriter(source)
    for index, (image, label) in enumerate(zip(x, y, strict=True)):
        encoded = io.BytesIO()
        Image.fromarray(image).save(encoded, format="PNG")
        writer.write(encode_example(b"not an image" if index == 33 else encoded.getvalue(), int(label)))
    writer.close()
    assert f"data.source: {source}: record 33 is not an image tfdist can read (PNG or JPEG)" in refused(
        preprocess(tmp_path, source), tmp_path)


def _relabelled(tmp_path, x, y):
    path = tmp_path / "other.tfrecord"
    write_tfrecords(path, x, y, label_key="class")
    return path


def test_jpeg_records_of_mixed_sizes_need_an_image_size(tmp_path):
    x, y = colour_set(60, classes=3)
    source = tmp_path / "set.tfrecords"
    writer = RecordWriter(source)
    for index, (image, label) in enumerate(zip(x, y, strict=True)):
        encoded = io.BytesIO()
        Image.fromarray(image if index != 7 else np.zeros((20, 16, 3), np.uint8)).save(encoded, format="JPEG")
        writer.write(encode_example(encoded.getvalue(), int(label)))
    writer.close()
    line = refused(preprocess(tmp_path, source), tmp_path)
    assert f"{source}: record 0 is 16x16 pixels and {source}: record 7 16x20" in line
    assert preprocess(tmp_path, source, "data.image_size=[12, 12]").exit_code == 0
