"""The search grid, its work items and the table of validation errors they fill.

Grid as the reference: log10 C in linspace(-3, 6, n), log10 gamma in linspace(-6, -2, n).
One item per (C, gamma, fold); keys name grid indexes, so they stay stable across runs.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Tuple

import numpy as np

from common import Item

LOG10_C_RANGE = (-3.0, 6.0)
LOG10_GAMMA_RANGE = (-6.0, -2.0)
REFIT_KEY = "refit"


@dataclass(frozen=True)
class Grid:
    """The (C, gamma) values searched, each with ``folds`` cross-validation fits."""

    n_tuning: int
    folds: int

    @property
    def c_values(self) -> np.ndarray:
        return 10.0 ** np.linspace(*LOG10_C_RANGE, self.n_tuning)

    @property
    def gamma_values(self) -> np.ndarray:
        return 10.0 ** np.linspace(*LOG10_GAMMA_RANGE, self.n_tuning)

    def points(self) -> Iterable[Tuple[int, int, int]]:
        """(i_C, i_gamma, fold) of every fit."""
        for i_gamma in range(self.n_tuning):
            for i_c in range(self.n_tuning):
                for fold in range(self.folds):
                    yield i_c, i_gamma, fold


def fit_key(i_c: int, i_gamma: int, fold: int) -> str:
    return f"C={i_c:04d},gamma={i_gamma:04d},fold={fold}"


def expected_cost(c: float, gamma: float) -> float:
    """Relative fit time, so the slowest fits start first (only the order matters).

    libsvm is slow where most training points become support vectors: small C (every point
    is a bounded support vector) and large gamma (each point its own neighbourhood).
    Measured with libsvm's own kernel (as cuML's solver, it computes kernel values while it
    iterates) on 8,000 Fashion-MNIST images, one core: about 3.3 s in the middle of the grid,
    25-28 s at C=1e-3, 35 s at C=1e6 with gamma=1e-2, 4.7 s at C=1e6 with gamma=1e-6.
    Falls with C, rises with gamma, about 1 in the middle and about 10 at those corners.
    """
    return 1.0 + max(8.0 / (1.0 + c / 0.1), 9.0 * gamma / 1e-2)


def grid_items(grid: Grid, share_kernels: bool = False) -> List[Item]:
    """Every (C, gamma, fold) fit, then the refit of the best pair that waits for all of them.

    ``share_kernels``: the fits of one (gamma, fold) form a group, so one worker computes their
    training kernel once for every C (``MnistSvm.run_group``)."""
    c_values, gamma_values = grid.c_values, grid.gamma_values
    items = [Item(key=fit_key(i_c, i_gamma, fold),
                  params={"kind": "fit", "C": float(c_values[i_c]), "gamma": float(gamma_values[i_gamma]),
                          "i_C": i_c, "i_gamma": i_gamma, "fold": fold},
                  cost=expected_cost(c_values[i_c], gamma_values[i_gamma]),
                  group=f"gamma={i_gamma:03d},fold={fold}" if share_kernels else "")
             for i_c, i_gamma, fold in grid.points()]
    # the refit trains on folds/(folds-1) times as many rows; kernel work grows with their square
    refit_cost = max(item.cost for item in items) * (grid.folds / max(grid.folds - 1, 1)) ** 2
    return items + [Item(key=REFIT_KEY, params={"kind": "refit"}, cost=refit_cost,
                         after=tuple(item.key for item in items))]


def error_table(grid: Grid, results: Mapping[str, object]) -> np.ndarray:
    """Validation errors as (folds, n_gamma, n_C), as the reference saved them; NaN where a fit failed."""
    table = np.full((grid.folds, grid.n_tuning, grid.n_tuning), np.nan)
    for i_c, i_gamma, fold in grid.points():
        result = results.get(fit_key(i_c, i_gamma, fold))
        if isinstance(result, Mapping) and result.get("error") is not None:
            table[fold, i_gamma, i_c] = float(result["error"])
    return table


def fold_mean(table: np.ndarray) -> np.ndarray:
    """Mean validation error per (gamma, C) over the folds that finished; NaN, silently, where none did."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Mean of empty slice", category=RuntimeWarning)
        return np.nanmean(table, axis=0)


def best_point(grid: Grid, table: np.ndarray) -> Dict[str, float]:
    """The (C, gamma) of lowest mean validation error, among the pairs with the most folds finished.

    A pair with every fold done beats one that looks better on fewer folds (1 lucky fold of 5 at
    0 % error is no evidence); only when no pair has all folds do the ones with the most count.
    Ties go to the first in (gamma, C) order, so the choice is the same on every run; the others
    are ``tied_with``.
    """
    counts = np.sum(~np.isnan(table), axis=0)
    most = int(counts.max()) if counts.size else 0
    if most == 0:
        raise RuntimeError("no (C, gamma) pair has a finished fit to choose from")
    mean = np.where(counts == most, fold_mean(table), np.nan)
    i_gamma, i_c = np.unravel_index(int(np.nanargmin(mean)), mean.shape)
    # the other pairs at the same error (errors are counts of images over a fold's size: ties are common)
    tied = [(int(g), int(c)) for g, c in zip(*np.nonzero(np.isclose(mean, mean[i_gamma, i_c], rtol=1e-12, atol=1e-15)))
            if (g, c) != (i_gamma, i_c)]
    return {"C": float(grid.c_values[i_c]), "gamma": float(grid.gamma_values[i_gamma]),
            "i_C": int(i_c), "i_gamma": int(i_gamma), "cv_error": float(mean[i_gamma, i_c]),
            "cv_folds": most,
            "tied_with": [{"C": float(grid.c_values[c]), "gamma": float(grid.gamma_values[g])} for g, c in tied]}
