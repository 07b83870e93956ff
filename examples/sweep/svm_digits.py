"""An RBF SVM's C and gamma on scikit-learn's digits, 5-fold cross-validated: one item per (C, gamma).

    mpiexec -n 2 python examples/sweep/svm_digits.py --gpu cpu --workers 2 --results results/svm_digits
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, where it is not installed

from common import sweep  # noqa: E402

GRID = {"C": [0.1, 1.0, 10.0, 100.0, 1000.0], "gamma": [0.001, 0.01, 0.1, 1.0]}


def load(device):
    """Once per worker: the data, scaled as the SVM likes it."""
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    return images / 16.0, labels


def fit(params, state):
    """Cross-validated error of one (C, gamma); the folds are fixed, so no seed is needed."""
    from sklearn.model_selection import cross_val_score
    from sklearn.svm import SVC

    images, labels = state
    accuracy = cross_val_score(SVC(C=params["C"], gamma=params["gamma"]), images, labels, cv=5)
    return {"error": 1.0 - float(accuracy.mean()), "fold_errors": [1.0 - a for a in accuracy.tolist()]}


if __name__ == "__main__":
    raise SystemExit(sweep.main(fit, grid=GRID, setup=load, minimise="error"))
