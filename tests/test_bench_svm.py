"""bench_svm times the reference's model against mnist_svm's CPU backend: the two must be the same
model, predicting the same labels, or its speedup compares different work (the reference fits one
RBF SVC per class, one-vs-rest; scikit-learn's SVC alone is one-vs-one)."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import StratifiedKFold

from benchmarks.bench_svm import our_item, reference_item
from common.data import Dataset
from mnist_svm.backends import PIXEL_CENTRE, PIXEL_SCALE, SklearnBackend


@pytest.mark.parametrize("c, gamma", [(10.0, 1e-3), (1e-3, 1e-6), (300.0, 1e-4)])
def test_the_reference_side_and_ours_predict_the_same_labels(c, gamma):
    digits = load_digits()
    pixels = (digits.images * 15.9375).astype(np.uint8)  # 0..16 -> 0..255, as IDX pixels
    labels = digits.target.astype(np.int64)
    ours = SklearnBackend(Dataset("digits", pixels, labels, pixels[:10], labels[:10]))
    x_ref = (pixels.reshape(len(pixels), -1).astype(np.float64) - PIXEL_CENTRE) / PIXEL_SCALE
    train, validation = next(StratifiedKFold(5, shuffle=True, random_state=0).split(x_ref, labels))
    expected = reference_item(x_ref, labels, train, validation, c, gamma)
    np.testing.assert_array_equal(our_item(ours, train, validation, c, gamma), expected)


def test_both_sides_give_a_tie_to_the_later_class_as_the_reference():
    """At gamma 10 most images tie (the decision values are the intercepts): the reference's
    scikit-learn 1.3.1 gave a tie to the later class, this scikit-learn's predict to the earlier."""
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.svm import SVC

    from common.data import load_dataset
    from mnist_svm.backends import standardise

    data = load_dataset("digits", subsample=400, seed=1)
    x, labels = standardise(data.x_train), data.y_train
    train, validation, c, gamma = np.arange(300), np.arange(300, 400), 1e-3, 10.0
    scores = OneVsRestClassifier(SVC(C=c, gamma=gamma)).fit(x[train], labels[train]).decision_function(x[validation])
    assert np.mean((scores == scores.max(axis=1, keepdims=True)).sum(axis=1) > 1) > 0.5  # the case at hand
    expected = reference_item(x, labels, train, validation, c, gamma)
    np.testing.assert_array_equal(our_item(SklearnBackend(data), train, validation, c, gamma), expected)
