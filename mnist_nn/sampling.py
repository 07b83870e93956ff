"""Bagging with K-fold CV: the training set is split into folds, then resampled within each fold.

Resampling *within* folds (as the reference does) keeps every copy of an image inside one
fold, so a validation fold never holds an image that its training folds also hold.
"""
from __future__ import annotations

from typing import List

import numpy as np
from sklearn.model_selection import KFold

from common import item_seed


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


def reference_stream(seed: int, bootstrap: int) -> np.random.Generator:
    """The reference's generator of bootstrap ``bootstrap``:
    ``default_rng(SeedSequence(seed).spawn(n_bootstrap)[bootstrap])`` (the child's identity is its
    spawn key alone, so n_bootstrap does not matter)."""
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(bootstrap,)))


def reference_bootstrap(n_train: int, folds: int, seed: int, bootstrap: int) -> tuple:
    """The reference's draws for one bootstrap, in its order: two ``bytes(8)`` (its torch CPU and
    CUDA seeds), ``permutation(n)``, then each contiguous fold (boundaries
    ``round(linspace(0, n, folds + 1))``) resampled within itself. Returns (folds, generator) with
    the generator where the reference goes on to draw the candidates."""
    rng = reference_stream(seed, bootstrap)
    rng.bytes(8)
    rng.bytes(8)
    shuffled = rng.permutation(n_train)
    edges = np.round(np.linspace(0, n_train, folds + 1)).astype(np.int64)
    chosen = [shuffled[rng.integers(lo, hi, hi - lo)] for lo, hi in zip(edges[:-1], edges[1:])]
    return chosen, rng
