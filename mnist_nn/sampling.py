"""Bagging with K-fold CV: the training set is split into folds, then resampled within each fold.

Resampling *within* folds (as the reference does) keeps every copy of an image inside one
fold, so a validation fold never holds an image that its training folds also hold.
"""
from __future__ import annotations

from typing import List

import numpy as np
from sklearn.model_selection import KFold

from common.items import item_seed


def bootstrap_folds(n_train: int, folds: int, seed: int, bootstrap: int) -> List[np.ndarray]:
    """Per fold, the training-set indexes of bootstrap ``bootstrap`` (drawn with replacement).

    A function of ``--seed`` and the bootstrap number only, so every worker computes the same.
    """
    rng = np.random.default_rng(item_seed(seed, f"bootstrap={bootstrap}"))
    split_state = int(rng.integers(0, 2 ** 31 - 1))
    splitter = KFold(n_splits=folds, shuffle=True, random_state=split_state)
    return [rng.choice(fold, size=len(fold), replace=True)
            for _, fold in splitter.split(np.arange(n_train))]


def fold_indexes(folds: List[np.ndarray], fold: int) -> tuple:
    """(training, validation) indexes for validating on ``fold``."""
    training = np.concatenate([f for i, f in enumerate(folds) if i != fold])
    return training, folds[fold]


def bootstrap_sample(folds: List[np.ndarray]) -> np.ndarray:
    """The whole bootstrap sample, for the refit."""
    return np.concatenate(folds)
