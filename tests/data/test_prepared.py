"""The prepared files: what the preprocess stage writes is what later stages read, and bad files are named."""

import numpy as np
import pytest

from tfdist.config.knobs import DataConfig
from tfdist.data.prepared import load_spec, load_split, save_prepared
from tfdist.data.sources import RawImages
from tfdist.data.stage import split_raw
from tfdist.errors import InputError

from helpers.digits import fake_mnist


def test_prepared_roundtrip_and_validation(tmp_path):
    data = split_raw(RawImages("t", *fake_mnist(100)), DataConfig(), seed=0)
    save_prepared(data, tmp_path / "prepared")
    assert sorted(p.name for p in (tmp_path / "prepared").iterdir()) == ["spec.json", "test.npz", "train.npz", "val.npz"]
    spec = load_spec(tmp_path / "prepared")
    assert spec == data.spec and spec.features == 784 and spec.classes == 10
    train = load_split(tmp_path / "prepared", "train", spec)
    np.testing.assert_array_equal(train.y, data.train.y)
    assert train.x.dtype == np.uint8 and train.features().shape == (len(train), 784), "pixels kept as bytes"
    other = type(spec)("other", (32, 32, 3), spec.class_names)
    with pytest.raises(InputError, match=r"expected uint8 images of shape \(N, 32, 32, 3\)"):
        load_split(tmp_path / "prepared", "train", other)
    (tmp_path / "prepared" / "val.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(InputError, match="val.npz is not a valid prepared split"):
        load_split(tmp_path / "prepared", "val", spec)
    with pytest.raises(InputError, match="run the preprocess stage first"):
        load_split(tmp_path / "missing", "train", spec)
    with pytest.raises(InputError, match="spec.json not found; run the preprocess stage"):
        load_spec(tmp_path / "missing")
