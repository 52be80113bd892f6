"""MNIST sources: IDX folders, npz files, Keras's download (hash-checked, bounded, cached) and the offline fallback."""

import functools
import hashlib
import http.server
import logging
import socket
import struct
import threading

import numpy as np
import pytest

from tfdist.data.sources import KERAS_MNIST_URL, Download, DownloadError, load_source, read_idx
from tfdist.errors import InputError

from helpers.digits import fake_mnist, write_idx


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


@pytest.mark.parametrize("compress", [False, True])
def test_idx_folder_source(tmp_path, compress):
    x, y = fake_mnist(50)
    suffix = ".gz" if compress else ""
    for stem, array in [("train-images-idx3-ubyte", x), ("train-labels-idx1-ubyte", y),
                        ("t10k-images-idx3-ubyte", x[:20]), ("t10k-labels-idx1-ubyte", y[:20])]:
        write_idx(tmp_path / (stem + suffix), array, compress)
    raw = load_source(str(tmp_path), timeout=1)
    assert raw.x_train.x.shape == (50, 28, 28) and raw.y_test.shape == (20,)
    np.testing.assert_array_equal(raw.x_train.x, x)


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
    assert load_source(str(tmp_path / "mnist.npz"), timeout=1).x_test.x.shape == (10, 28, 28)


def test_missing_path_source(tmp_path):
    with pytest.raises(InputError, match="data.source: .*nowhere does not exist"):
        load_source(str(tmp_path / "nowhere"), timeout=1)


def test_the_keras_source_downloads_checks_and_caches(tmp_path, mnist_server):
    raw = load_source("keras", timeout=5, cache_dir=tmp_path / "cache", download=mnist_server)
    assert raw.source == "MNIST" and raw.x_train.x.shape == (30, 28, 28) and raw.x_test.x.shape == (10, 28, 28)
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
    assert raw.source == "MNIST sample" and len(raw.y_train) == 5000
    assert "using the 5,000-digit offline sample" in caplog.text


def test_a_corrupt_cache_is_reported_not_trusted(tmp_path, caplog):
    (tmp_path / "datasets").mkdir()
    x, y = fake_mnist(30)
    np.savez(tmp_path / "datasets" / "mnist.npz", x_train=x, y_train=y, x_test=x[:10], y_test=y[:10])
    with pytest.raises(DownloadError, match="cached .*mnist.npz failed its hash check"):
        load_source("keras", timeout=2, cache_dir=tmp_path, download=closed_port_download())
    with caplog.at_level(logging.WARNING):
        assert load_source("auto", timeout=2, cache_dir=tmp_path, download=closed_port_download()).source == "MNIST sample"


def test_the_default_download_is_keras_own_file():
    assert Download() == Download(KERAS_MNIST_URL, "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1")
