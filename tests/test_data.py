"""The shared data loader on real data: digits, Debian's Fashion-MNIST, and broken IDX files."""
from __future__ import annotations

import gzip
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from common.data import (
    DATASETS,
    DEBIAN_FASHION_MNIST,
    IDX_FILES,
    PUBLISHED_FIRST_LABELS,
    Dataset,
    check_available,
    find_idx_files,
    load_dataset,
    read_idx,
    resize_images,
)
from common.errors import UsageError
from helpers import write_idx

HAVE_DEBIAN_FASHION = all(
    (DEBIAN_FASHION_MNIST / f"{stem}.gz").is_file() for stem in IDX_FILES.values())


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
    # each refusal names the bound it breaks, with no range that the folds' own bound would contradict
    with pytest.raises(UsageError, match=r"^--subsample 5: fewer than the 10 classes \(it keeps at least one image of each\)$"):
        load_dataset("digits", subsample=5)
    with pytest.raises(UsageError, match=rf"^--subsample 99999: more than the {len(full.y_train)} training images there are$"):
        load_dataset("digits", subsample=99999)


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
    data = load_dataset("fashion-mnist")  # no --data-dir: data/ first, then Debian's folder
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
    with pytest.raises(UsageError, match="train-images-idx3-ubyte': truncated") as error:
        read_idx(path)
    assert "\n" not in str(error.value)


def test_unknown_dataset_is_a_usage_error():
    assert "digits" in DATASETS
    with pytest.raises(UsageError, match="unknown dataset"):
        load_dataset("cifar")
    with pytest.raises(UsageError, match="unknown dataset"):
        check_available("cifar", None)


def idx_folder(folder: Path, **arrays: np.ndarray) -> Path:
    """The four MNIST files in ``folder``: 20 train and 10 test images of 28x28, unless replaced."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = {"x_train": np.zeros((20, 28, 28)), "y_train": np.arange(20) % 10,
             "x_test": np.zeros((10, 28, 28)), "y_test": np.arange(10), **arrays}
    for part, stem in IDX_FILES.items():
        write_idx(folder / stem, parts[part])
    return folder


@pytest.mark.parametrize("case, fragment", [
    ("test images 8x8", r"train-images-idx3-ubyte': images of 28x28 pixels, but 8x8 in .*t10k-images-idx3-ubyte"),
    ("empty train", r"train-images-idx3-ubyte': no images \(the train split is empty\)"),
    ("empty test", r"t10k-images-idx3-ubyte': no images \(the test split is empty\)"),
    ("images of no pixels", r"train-images-idx3-ubyte': images of 0x0 pixels: no pixels"),
    ("label 12", r"t10k-labels-idx1-ubyte': expected integer labels 0-9, got uint8 from 0 to 12"),
])
def test_inconsistent_idx_files_are_one_line_naming_the_file(tmp_path, case, fragment):
    arrays = {"test images 8x8": {"x_test": np.zeros((10, 8, 8))},
              "empty train": {"x_train": np.zeros((0, 28, 28)), "y_train": np.zeros(0)},
              "empty test": {"x_test": np.zeros((0, 28, 28)), "y_test": np.zeros(0)},
              "images of no pixels": {"x_train": np.zeros((20, 0, 0)), "x_test": np.zeros((10, 0, 0))},
              "label 12": {"y_test": np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 12])}}[case]
    folder = idx_folder(tmp_path, **arrays)
    with pytest.raises(UsageError, match=fragment) as error:
        load_dataset("mnist", folder)
    assert "\n" not in str(error.value)


def test_a_data_folder_that_may_not_be_looked_into_is_one_line(tmp_path, monkeypatch):
    """--data-dir of another user's folder (mode 700): is_file raises PermissionError there
    (it says False only for a missing name); the search says so in one line."""
    real = Path.is_file

    def refused(path: Path) -> bool:
        if path.parent == tmp_path:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(Path, "is_file", refused)
    with pytest.raises(UsageError, match=r"cannot look for the data set in '.*': Permission denied$"):
        check_available("mnist", tmp_path)
    # a default place (./MNIST/raw, data/) that may not be looked into is not where the files are: the
    # search goes on (to the next place, or a download), as for a place that does not exist
    monkeypatch.chdir(tmp_path.parent)
    monkeypatch.setattr("common.data.default_data_dir", lambda: tmp_path)
    assert find_idx_files("mnist") is None


def test_huge_idx_dimensions_are_a_usage_error_not_an_overflow(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    # 2^32-1 cubed overflows int64 (about 7.9e28 bytes)
    path.write_bytes(bytes([0, 0, 0x08, 3]) + struct.pack(">3I", *[2 ** 32 - 1] * 3) + b"\0" * 64)
    with pytest.raises(UsageError, match=r"train-images-idx3-ubyte': truncated: 64 data bytes .* \(7922816\d+ expected\)"):
        read_idx(path)


def test_n_classes_of_empty_labels_is_zero():
    empty = np.zeros(0, np.int64)
    assert Dataset("none", np.zeros((0, 8, 8), np.uint8), empty, np.zeros((0, 8, 8), np.uint8), empty).n_classes == 0
    assert load_dataset("digits").n_classes == 10


@pytest.mark.parametrize("layout", ["", "fashion-mnist", "FashionMNIST/raw"])
def test_explicit_data_dir_and_its_usual_subfolders_are_searched(tmp_path, layout):
    idx_folder(tmp_path / layout)
    files = find_idx_files("fashion-mnist", tmp_path)
    assert files is not None and all(path.parent == tmp_path / layout for path in files.values())
    assert load_dataset("fashion-mnist", tmp_path).x_train.shape == (20, 28, 28)


@pytest.mark.parametrize("given, other", [("mnist", "fashion-mnist"), ("fashion-mnist", "mnist")])
@pytest.mark.parametrize("part", ["y_train", "y_test"])
def test_the_files_of_one_mnist_given_as_the_other_are_refused(tmp_path, given, other, part):
    """MNIST and Fashion-MNIST share file names and shapes: a folder of one named as the other is one
    line (its labels begin as the other's published files do), never a run under the wrong name.
    Named as what it is, it loads; labels that begin otherwise load as before."""
    labels = np.concatenate([PUBLISHED_FIRST_LABELS[other][part], np.arange(4)])  # 20 labels
    images = {"x_test": np.zeros((20, 28, 28))} if part == "y_test" else {}
    folder = idx_folder(tmp_path / "data", **images, **{part: labels})
    with pytest.raises(UsageError) as error:
        load_dataset(given, folder)
    assert str(error.value) == (f"--dataset {given}, but '{folder / IDX_FILES[part]}' is {other}'s: its labels begin "
                                f"as the published {other} files' do (the two use the same file names); use --dataset {other}")
    assert len(load_dataset(other, folder).y_train) == 20
    own = idx_folder(tmp_path / "own", **images, **{part: np.roll(labels, 1)})
    assert len(load_dataset(given, own).y_train) == 20


@pytest.mark.skipif(not HAVE_DEBIAN_FASHION, reason="Debian package dataset-fashion-mnist is not installed")
def test_debians_fashion_mnist_given_as_mnist_is_refused():
    with pytest.raises(UsageError, match=r"^--dataset mnist, but .*train-labels-idx1-ubyte.gz' is fashion-mnist's"):
        load_dataset("mnist", DEBIAN_FASHION_MNIST)


@pytest.mark.parametrize("case", ["a file", "missing folder", "3 of 4 files", "empty folder"])
def test_explicit_data_dir_is_never_replaced_by_the_system_copy(tmp_path, case):
    """Debian's Fashion-MNIST (where installed) is not looked at once --data-dir is given."""
    data_dir = tmp_path / "data"
    if case == "a file":
        data_dir.write_bytes(b"")
    elif case == "3 of 4 files":
        idx_folder(data_dir / "FashionMNIST" / "raw")
        (data_dir / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    elif case == "empty folder":
        data_dir.mkdir()
    assert find_idx_files("fashion-mnist", data_dir) is None
    expected = {"a file": "is not a folder", "missing folder": "does not exist",
                "3 of 4 files": "lacks t10k-labels-idx1-ubyte (plain or .gz)", "empty folder": "none of the IDX files"}[case]
    for check in (check_available, load_dataset):
        with pytest.raises(UsageError, match=re.escape(expected)) as error:
            check("fashion-mnist", data_dir)
        assert "\n" not in str(error.value) and str(DEBIAN_FASHION_MNIST) not in str(error.value)


@pytest.mark.parametrize("program", [["-m", "mnist_svm", "2"], ["-m", "mnist_nn", "1", "1"]])
def test_training_labels_of_one_class_are_refused_by_both_apps(tmp_path, program):
    """A data set with nothing to tell apart: the same one line from either app, exit 2, nothing written."""
    from helpers import assert_usage_error, run, snapshot

    data_dir = idx_folder(tmp_path / "one class", y_train=np.full(20, 3))
    results = tmp_path / "results"
    before = snapshot(tmp_path)
    proc = run([*program, "--dataset", "mnist", "--data-dir", str(data_dir), "--folds", "2", "--results", str(results)],
               timeout=120)
    assert_usage_error(proc, f"{str(data_dir / 'train-labels-idx1-ubyte')!r}: every training label is 3: "
                             f"a classifier needs images of at least two classes")
    assert not results.exists() and snapshot(tmp_path) == before
    with pytest.raises(UsageError, match="every training label is 3"):
        load_dataset("mnist", data_dir)


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_torchvisions_mirrors_are_read_from_its_source_as_its_import_gives_them(name):
    """The download check reads the mirrors without importing torch (seconds): the same list the
    installed torchvision's classes hold, which a child importing it reports."""
    import common.data as data

    pytest.importorskip("torchvision")
    read = data._mirrors_in_source(name)
    imported, problem = data._mirrors(name)
    assert problem is None and read == imported and read


def test_a_sitecustomize_that_may_change_the_mirrors_sends_the_check_to_torchvision_itself(tmp_path, monkeypatch):
    """One that names torchvision may change its mirrors as it imports: the child is asked. One that
    does not (Debian's and Ubuntu's own, apport's hook, is loaded in every venv made from their
    python3) leaves the mirrors read from the source."""
    import sys
    import types

    import common.data as data

    pytest.importorskip("torchvision")
    for name, source, read in (("sitecustomize", "import apport_python_hook\n", True),
                               ("usercustomize", "import torchvision.datasets  # mirrors = [...]\n", False)):
        module = types.ModuleType(name)
        module.__file__ = str(tmp_path / f"{name}.py")
        Path(module.__file__).write_text(source)
        monkeypatch.setitem(sys.modules, name, module)
        assert (data._mirrors_in_source("mnist") is not None) is read, (name, source)


def test_missing_data_offline_is_refused_without_importing_torchvision(tmp_path, monkeypatch):
    """Offline, no mirror can be reached: known from the mirrors in torchvision's source, without
    the child that imports it (4.5 s of CPU here for every missing data set)."""
    import common.data as data

    pytest.importorskip("torchvision")
    monkeypatch.setattr(data, "_torchvision_child", lambda *argv, timeout: pytest.fail("torchvision imported"))
    monkeypatch.setattr(data.socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    with pytest.raises(UsageError, match="offline: no download mirror can be reached"):
        check_available("mnist", tmp_path / "nothing here")
