"""How mnist_nn's results are keyed and stored in the journal: item keys, cross-validation scores
and encoded arrays. Shared by the app and its report without either importing the other."""
from __future__ import annotations

import base64
import math
from typing import Any, Dict, Mapping

import numpy as np


def fit_key(bootstrap: int, candidate: int, fold: int) -> str:
    return f"b={bootstrap:02d},c={candidate:02d},f={fold}"


def refit_key(bootstrap: int) -> str:
    return f"b={bootstrap:02d},refit"


def model_stem(bootstrap: int) -> str:
    return f"bootstrap-{bootstrap}"


def cv_scores(results: Mapping[str, Any], bootstrap: int, n_tuning: int, folds: int) -> Dict[int, float]:
    """Candidate -> mean validation loss, for candidates whose K folds are all done (diverged = inf)."""
    scores = {}
    for c in range(n_tuning):
        found = [results.get(fit_key(bootstrap, c, f)) for f in range(folds)]
        if any(result is None for result in found):
            continue
        losses = [math.inf if r["val_loss"] is None else r["val_loss"] for r in found]
        scores[c] = float(np.mean(losses))
    return scores


def encode_array(array: np.ndarray) -> Dict[str, Any]:
    """A float32 array as base64 of its little-endian bytes: exact, and 3x smaller than JSON numbers."""
    return {"shape": list(array.shape), "float32_base64": base64.b64encode(array.tobytes()).decode("ascii")}


def decode_array(encoded: Mapping[str, Any]) -> np.ndarray:
    raw = base64.b64decode(encoded["float32_base64"])
    return np.frombuffer(raw, dtype="<f4").reshape(encoded["shape"]).astype(np.float32)


def check_probabilities(encoded: Mapping[str, Any]) -> None:
    """Raise ValueError unless ``encoded`` (:func:`encode_array`) holds a images x classes array of
    probabilities: what a journal edited or damaged by hand would otherwise fail the report with."""
    shape = encoded["shape"]
    if len(shape) != 2 or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape):
        raise ValueError(f"test_probabilities' shape {shape!r} is not images x classes")
    try:
        raw = base64.b64decode(encoded["float32_base64"], validate=True)
    except ValueError:
        raise ValueError("test_probabilities' float32_base64 is not base64") from None
    if len(raw) != 4 * shape[0] * shape[1]:
        raise ValueError(f"test_probabilities holds {len(raw)} bytes, not the {4 * shape[0] * shape[1]} of {shape}")
    values = np.frombuffer(raw, dtype="<f4")
    if np.any((values < 0) | (values > 1)):  # NaN passes: a refit whose training diverged gives NaN
        raise ValueError("test_probabilities holds values outside [0, 1]")
