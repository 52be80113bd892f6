"""The prepared files: what the preprocess stage writes is what later stages read, and bad files are named."""

import numpy as np
import pytest

from tfdist.config import DataConfig
from tfdist.data.prepared import load_split, save_prepared
from tfdist.data.sources import RawDigits
from tfdist.data.stage import split_raw
from tfdist.errors import InputError

from helpers.digits import fake_mnist


def test_prepared_roundtrip_and_validation(tmp_path):
    data = split_raw(RawDigits("t", *fake_mnist(100)), DataConfig(), seed=0)
    save_prepared(data, tmp_path / "prepared")
    assert sorted(p.name for p in (tmp_path / "prepared").iterdir()) == ["test.npz", "train.npz", "val.npz"]
    np.testing.assert_array_equal(load_split(tmp_path / "prepared", "train").y, data.train.y)
    (tmp_path / "prepared" / "val.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(InputError, match="val.npz is not a valid prepared split"):
        load_split(tmp_path / "prepared", "val")
    with pytest.raises(InputError, match="run the preprocess stage first"):
        load_split(tmp_path / "missing", "train")
