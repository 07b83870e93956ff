"""The shared data loader on real data: digits, Debian's Fashion-MNIST, and broken IDX files."""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from common.data import (DEBIAN_FASHION_MNIST, DATASETS, IDX_FILES, check_available, find_idx_files,
                         load_dataset, read_idx, resize_images)
from common.errors import UsageError

HAVE_DEBIAN_FASHION = all(
    (DEBIAN_FASHION_MNIST / f"{stem}.gz").is_file() for stem in IDX_FILES.values())


def write_idx(path: Path, array: np.ndarray, *, compress: bool = False) -> Path:
    """An IDX file as the format defines it: zero, zero, type, ndim, big-endian dims, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(payload) if compress else payload)
    return path


def test_digits_is_the_real_data_set_split_75_25():
    data = load_dataset("digits")
    assert data.x_train.shape == (1347, 8, 8) and data.x_test.shape == (450, 8, 8)
    assert data.x_train.dtype == np.uint8 and data.y_train.dtype == np.int64
    assert data.x_train.max() == 255 and data.x_train.min() == 0
    assert set(np.unique(data.y_train)) == set(range(10)) == set(np.unique(data.y_test))
    again = load_dataset("digits")
    np.testing.assert_array_equal(data.x_test, again.x_test)  # the split never moves


def test_subsample_is_stratified_seeded_and_leaves_test_alone():
    full = load_dataset("digits")
    a = load_dataset("digits", subsample=500, seed=1)
    b = load_dataset("digits", subsample=500, seed=1)
    c = load_dataset("digits", subsample=500, seed=2)
    assert a.x_train.shape == (500, 8, 8)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.x_train, c.x_train)
    np.testing.assert_array_equal(a.x_test, full.x_test)
    expected = np.bincount(full.y_train) * 500 / len(full.y_train)
    assert np.all(np.abs(np.bincount(a.y_train) - expected) <= 1)
    with pytest.raises(UsageError):
        load_dataset("digits", subsample=5)


def test_resize_digits_to_mnist_shape():
    images = load_dataset("digits").x_train[:20]
    big = resize_images(images, 28)
    assert big.shape == (20, 28, 28) and big.dtype == np.uint8
    np.testing.assert_array_equal(big, resize_images(images, 28))
    # bilinear keeps the mean brightness close
    assert abs(float(big.mean()) - float(images.mean())) < 5
    assert resize_images(images.astype(np.float64), 28).dtype == np.float32


@pytest.mark.skipif(not HAVE_DEBIAN_FASHION, reason="Debian package dataset-fashion-mnist is not installed")
def test_real_fashion_mnist_from_debian():
    data = load_dataset("fashion-mnist", Path("/nonexistent-data-dir"))
    assert data.x_train.shape == (60000, 28, 28) and data.x_test.shape == (10000, 28, 28)
    assert data.x_train.dtype == np.uint8
    assert np.array_equal(np.bincount(data.y_train), np.full(10, 6000))
    assert np.array_equal(np.bincount(data.y_test), np.full(10, 1000))
    check_available("fashion-mnist", None)  # no error: the files are there


def test_idx_round_trip_plain_and_gzip(tmp_path):
    images = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "a", images)), images)
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "a.gz", images, compress=True)), images)


def test_mnist_layout_from_data_dir(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "MNIST" / "raw"  # torchvision's layout
    folder.mkdir(parents=True)
    for part, stem in IDX_FILES.items():
        n = 30 if "train" in part else 10
        array = rng.integers(0, 256, (n, 28, 28)) if part.startswith("x") else np.arange(n) % 10
        write_idx(folder / f"{stem}.gz", array, compress=True)
    assert find_idx_files("mnist", tmp_path) is not None
    data = load_dataset("mnist", tmp_path)
    assert data.x_train.shape == (30, 28, 28) and data.y_test.tolist() == list(range(10))


def test_corrupt_idx_is_rejected_naming_the_file(tmp_path):
    bad = tmp_path / "train-images-idx3-ubyte"
    bad.write_bytes(b"this is not an IDX file at all")
    with pytest.raises(UsageError, match="train-images-idx3-ubyte.*not an IDX file") as error:
        read_idx(bad)
    assert "\n" not in str(error.value)
    broken_gzip = tmp_path / "t10k-images-idx3-ubyte.gz"
    broken_gzip.write_bytes(gzip.compress(b"\0" * 1000)[:30])
    with pytest.raises(UsageError, match="t10k-images-idx3-ubyte.gz"):
        read_idx(broken_gzip)


def test_truncated_idx_is_rejected_naming_the_file(tmp_path):
    path = write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((10, 28, 28), np.uint8))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(UsageError, match="train-images-idx3-ubyte: truncated") as error:
        read_idx(path)
    assert "\n" not in str(error.value)


def test_unknown_dataset_is_a_usage_error():
    assert "digits" in DATASETS
    with pytest.raises(UsageError, match="unknown dataset"):
        load_dataset("cifar")
    with pytest.raises(UsageError, match="unknown dataset"):
        check_available("cifar", None)
