"""The user's own images: an .npz of x and y, a folder of PNG and JPEG images per class, and every way they can be wrong.

Each bad input is refused by the preprocess stage's own command (in process, as
tests/cli/test_bad_inputs.py runs every stage): one line naming the file, key or
class, exit 2, nothing written.
"""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from stages import preprocess as preprocess_stage
from tfdist.config.knobs import DataConfig
from tfdist.data.prepared import SPLITS, load_spec, load_split
from tfdist.data.sources import load_source
from tfdist.data.stage import prepare

from helpers.digits import colour_set, image_folder
from helpers.project import REPO


def prepared_back(config, folder):
    """``prepare`` into ``folder``, and what it wrote read back: the spec and every split's arrays."""
    prepare(config, 0, folder)
    spec = load_spec(folder)
    return spec, {name: load_split(folder, name, spec).read() for name in SPLITS}


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_an_npz_of_colour_images_with_its_own_test_split_and_class_names(tmp_path, save):
    x, y = colour_set(60, classes=3)
    save(tmp_path / "parts.npz", x=x, y=y, x_test=x[:12], y_test=y[:12], class_names=np.array(["bolt", "nut", "gear"]))
    spec, data = prepared_back(DataConfig(source=str(tmp_path / "parts.npz")), tmp_path / "prepared")
    assert spec.describe() == "parts (16x16x3, 3 classes)" and spec.class_names == ("bolt", "nut", "gear")
    assert len(data["test"]) == 12 and len(data["train"]) + len(data["val"]) == 60
    np.testing.assert_array_equal(data["test"].x, x[:12]), "mapped (savez) or inflated (savez_compressed): the same"


def test_a_folder_of_png_and_jpeg_images_one_subfolder_a_class(tmp_path):
    folder = image_folder(tmp_path / "shapes", {"circle": 6, "square": 6}, size=(12, 10))
    Image.fromarray(np.zeros((12, 10, 3), dtype=np.uint8)).save(folder / "square" / "extra.jpg", quality=95)
    (folder / "square" / ".DS_Store").write_bytes(b"\0")  # hidden files are passed over
    raw = load_source(str(folder), timeout=1)
    assert raw.class_names == ("circle", "square") and raw.x_train.take(np.arange(13)).shape == (13, 12, 10, 3)
    assert np.bincount(raw.y_train).tolist() == [6, 7]
    resized = load_source(str(folder), timeout=1, image_size=(8, 8))
    assert resized.x_train.take(np.arange(13)).shape == (13, 8, 8, 3)


def test_fashion_mnist_format_idx_files_are_read_as_mnist_s(tmp_path):
    from helpers.digits import write_idx

    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (40, 28, 28), dtype=np.uint8), np.arange(40, dtype=np.uint8) % 10
    folder = tmp_path / "fashion"
    folder.mkdir()
    for stem, array in [("train-images-idx3-ubyte", x), ("train-labels-idx1-ubyte", y),
                        ("t10k-images-idx3-ubyte", x[:20]), ("t10k-labels-idx1-ubyte", y[:20])]:
        write_idx(folder / f"{stem}.gz", array, True)
    spec, data = prepared_back(DataConfig(source=str(folder), validation_split=0.25), tmp_path / "prepared")
    assert spec.describe() == "fashion (28x28x1, 10 classes)" and len(data["test"]) == 20
    assert {image.tobytes() for image in data["test"].x} == {image.tobytes() for image in x[:20]}


def preprocess(tmp_path, source, *sets: str):
    return CliRunner().invoke(preprocess_stage.main, [
        "--params", str(REPO / "params.yaml"), "--set", f"data.source={source}",
        *(arg for item in sets for arg in ("--set", item)),
        "--out", str(tmp_path / "prepared"), "--report", str(tmp_path / "data.json")])


def refused(done, tmp_path) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.exit_code == 2 and len(lines) == 1, done.stderr
    assert not (tmp_path / "prepared").exists() and not (tmp_path / "data.json").exists(), "nothing written"
    return lines[0]


def bad_npz(tmp_path, **arrays) -> str:
    np.savez(tmp_path / "bad.npz", **arrays)
    return str(tmp_path / "bad.npz")


@pytest.mark.parametrize(("arrays", "message"), [
    ({"x": np.zeros((4, 8, 8)), "y": np.zeros(3)}, "x holds 4 images and y (3,) labels; give one label per image"),
    ({"x": np.zeros((4, 8, 8)), "y": np.array([0, 1, -1, 0])}, "labels must be 0..K-1, found -1"),
    ({"x": np.zeros((4, 8, 8)), "y": np.array([0, 1, 0.5, 0])}, "labels must be whole numbers 0..K-1"),
    ({"x": np.zeros((4, 8, 8)), "y": np.zeros(4)}, "one class only (0); a classifier needs at least 2"),
    ({"x": np.zeros((4, 8, 8)), "y": np.array([0, 2, 2, 0])}, "no image of class 1"),
    ({"x": np.full((4, 8, 8), np.inf), "y": np.array([0, 1, 0, 1])}, "image 0 has NaN or infinite pixels"),
    ({"x": np.zeros((4, 8, 8)), "y": np.array([0, 1, 0, 1])},
     "class 0 has 2 image(s); the test and validation splits (data.test_split, data.validation_split) need at least 7"),
    ({"images": np.zeros((4, 8, 8))}, "lacks arrays x, y (an .npz needs x, the images, and y, their labels"),
])
def test_a_bad_npz_is_named_in_one_line_exit_2_nothing_written(tmp_path, arrays, message):
    line = refused(preprocess(tmp_path, bad_npz(tmp_path, **arrays)), tmp_path)
    assert line.startswith("error: ") and message in line


def test_bad_image_folders_are_named_in_one_line_exit_2_nothing_written(tmp_path):
    folder = image_folder(tmp_path / "set", {"a": 7, "b": 7}, size=(8, 8))
    (folder / "b" / "notes.txt").write_text("not an image")
    assert f"{folder / 'b' / 'notes.txt'} is not an image tfdist can read (PNG or JPEG)" in refused(
        preprocess(tmp_path, folder), tmp_path)
    (folder / "b" / "notes.txt").unlink()
    Image.fromarray(np.zeros((9, 8, 3), dtype=np.uint8)).save(folder / "b" / "tall.png")
    line = refused(preprocess(tmp_path, folder), tmp_path)
    assert f"{folder / 'a' / '0.png'} is 8x8 pixels and {folder / 'b' / 'tall.png'} 8x9" in line
    assert "set data.image_size: [height, width] to resize them all" in line
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(folder / "b" / "tall.png")
    assert f"{folder / 'a' / '0.png'} has 3 channel(s) and {folder / 'b' / 'tall.png'} 1" in refused(
        preprocess(tmp_path, folder), tmp_path)
    (folder / "b" / "tall.png").unlink()
    (folder / "c").mkdir()
    assert f"class folder {folder / 'c'} is empty" in refused(preprocess(tmp_path, folder), tmp_path)
    assert f"data.source: {tmp_path / 'nowhere'} does not exist" in refused(preprocess(tmp_path, tmp_path / "nowhere"),
                                                                            tmp_path)
    assert "data.image_size must be [height, width] or []" in refused(
        preprocess(tmp_path, folder, "data.image_size=[8]"), tmp_path)


def test_the_preprocess_stage_records_shape_and_class_names_in_its_report(tmp_path):
    folder = image_folder(tmp_path / "set", {"cat": 10, "dog": 10}, size=(6, 6))
    done = preprocess(tmp_path, folder)
    assert done.exit_code == 0, done.output
    report = json.loads((tmp_path / "data.json").read_text())
    assert (report["source"], report["shape"], report["class_names"]) == ("set", [6, 6, 3], ["cat", "dog"])
    assert report["splits"]["test"]["per_class"] == {"cat": 2, "dog": 2}
