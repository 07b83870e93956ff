"""mnist_svm's defaults are the reference's statistics: one-vs-rest RBF SVCs, contiguous unshuffled
folds (boundaries round(linspace(0, n, 6))), pixels (x - 127.5) / 73.61 in float64. Checked against
an independent recomputation with scikit-learn on a small MNIST-format IDX set written here."""
import subprocess
import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.multiclass import OneVsRestClassifier
from sklearn.svm import SVC

from test_data import write_idx

ROOT = Path(__file__).resolve().parents[1]
N_TUNING = 3


def write_small_mnist(root: Path) -> tuple:
    """sklearn's 8x8 digits blown up to 28x28 (3x3 blocks, padded), as torchvision's MNIST/raw."""
    digits = load_digits()
    images = np.pad(np.kron(digits.images * 16, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2))).clip(0, 255)
    images, labels = images.astype(np.uint8), digits.target
    folder = root / "MNIST" / "raw"
    folder.mkdir(parents=True)
    parts = {"train-images-idx3-ubyte": images[:150], "train-labels-idx1-ubyte": labels[:150],
             "t10k-images-idx3-ubyte": images[150:190], "t10k-labels-idx1-ubyte": labels[150:190]}
    for stem, array in parts.items():
        write_idx(folder / stem, array)
    return images[:150], labels[:150]


def test_validation_errors_are_the_reference_one_vs_rest_on_contiguous_folds(tmp_path):
    x_train, y_train = write_small_mnist(tmp_path / "data")
    results = tmp_path / "results"
    done = subprocess.run([sys.executable, "-m", "mnist_svm", str(N_TUNING), "--dataset", "mnist", "--data-dir",
                           str(tmp_path / "data"), "--gpu", "cpu", "--no-progress", "--results", str(results)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    table = np.load(results / "validation_error.npy")
    x = (x_train.reshape(len(x_train), -1).astype(np.float64) - 127.5) / 73.61
    n = len(y_train)
    edges = np.round(np.linspace(0, n, 6)).astype(int)
    expected = np.empty((5, N_TUNING, N_TUNING))
    for fold, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        train = np.r_[0:lo, hi:n]
        for i_gamma, gamma in enumerate(10.0 ** np.linspace(-6, -2, N_TUNING)):
            for i_c, c in enumerate(10.0 ** np.linspace(-3, 6, N_TUNING)):
                model = OneVsRestClassifier(SVC(C=c, gamma=gamma, kernel="rbf")).fit(x[train], y_train[train])
                expected[fold, i_gamma, i_c] = np.mean(model.predict(x[lo:hi]) != y_train[lo:hi])
    assert table.shape == expected.shape
    np.testing.assert_array_equal(table, expected)
    assert table.min() < 0.5  # the data are learnable: the comparison is not between two trivial tables
