"""Fitting an RBF SVC on one worker: scikit-learn on a CPU, cuML on a GPU.

Both hold the standardised training and test pixels once per worker (on the GPU: copied to
the device once, then rows are gathered there per fit), so an item only says which rows.
cuML and CuPy are imported here, inside a GPU worker, and nowhere else.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np

from common import Dataset

#: the reference's standardisation of 0-255 pixels
PIXEL_CENTRE = 127.5
PIXEL_SCALE = 73.61
#: kernel cache per fit (MB); libsvm's default of 200 MB thrashes on MNIST-sized folds
CACHE_MB = 1024
#: largest float64 kernel matrix of a fold computed up front on a CPU (16,384 rows)
PRECOMPUTE_MAX_BYTES = 2 * 1024 ** 3


def standardise(images: np.ndarray) -> np.ndarray:
    """uint8 (n, h, w) -> (n, h*w) centred and scaled as the reference, in float64 as there: libsvm
    computes in float64, and cuML's SVC keeps float64 input and fits in double precision (float32
    pixels could change a prediction, and so the chosen point)."""
    flat = images.reshape(len(images), -1).astype(np.float64)
    flat -= PIXEL_CENTRE
    flat /= PIXEL_SCALE
    return flat


def _multiclass(svc: Any, multiclass: str) -> Any:
    """One-vs-rest (the reference's cuML ``multiclass_strategy="ovr"``): one binary SVC per class,
    predicting the class of the largest decision value; or libsvm's own one-vs-one."""
    from sklearn.multiclass import OneVsRestClassifier

    return OneVsRestClassifier(svc) if multiclass == "ovr" else svc


def last_argmax(scores: Any, xp: Any = np) -> Any:
    """Per row, the index of the largest score, a tie going to the later column: the reference's
    one-vs-rest (scikit-learn 1.3.1 under cuML 23.08, its requirements-pin.txt). scikit-learn has
    since turned OneVsRestClassifier.predict's ties to the earlier class (1.9.1 here), and at large
    gamma most test images may tie (kernel values between distinct images of 1e-200 and less vanish
    beside the intercepts, which are then the decision values, often equal), so
    the rule is ours, the same on every release and on the CPU and the GPU. ``xp``: numpy or CuPy."""
    return scores.shape[1] - 1 - xp.argmax(scores[:, ::-1], axis=1)


def _predicted(model: Any, x: np.ndarray) -> np.ndarray:
    """``model``'s classes for ``x``; one-vs-rest over more than two classes by :func:`last_argmax`."""
    if hasattr(model, "estimators_") and len(model.classes_) > 2:
        return model.classes_[last_argmax(model.decision_function(x))]
    return model.predict(x)


def _support(model: Any) -> np.ndarray:
    """Training-row indexes of the support vectors (of every binary SVC, without repeats)."""
    if hasattr(model, "estimators_"):
        return np.unique(np.concatenate([e.support_ for e in model.estimators_]))
    return np.asarray(model.support_)


def have_cuml() -> bool:
    """Whether cuML is installed, without importing it (that would touch CUDA)."""
    return importlib.util.find_spec("cuml") is not None


@dataclass
class PrecomputedModel:
    """An SVC fitted on a precomputed RBF kernel, with what predicting needs: the support rows."""

    svc: Any
    gamma: float
    support: np.ndarray  # indexes (into the fit's rows) of every support vector
    support_x: np.ndarray  # float64 rows of the support vectors
    n_train: int


class SklearnBackend:
    """scikit-learn's libsvm on the worker's CPU.

    Where a fold's kernel matrix fits in ``PRECOMPUTE_MAX_BYTES``, the RBF kernel is computed
    with BLAS (``sklearn.metrics.pairwise.rbf_kernel``, float64, the same formula libsvm uses)
    and handed to libsvm precomputed: libsvm's own kernel is a scalar loop per pair and is
    most of a fit's time. Larger folds (full MNIST on a CPU) use libsvm's kernel and cache.
    """

    name = "sklearn"

    def __init__(self, data: Dataset, multiclass: str = "ovr"):
        self.multiclass = multiclass
        self.x = {"train": standardise(data.x_train), "test": standardise(data.x_test)}
        self.y = {"train": data.y_train, "test": data.y_test}
        self.truth = self.y  # labels on the host, to score predictions

    def _rows(self, split: str, rows: Any) -> np.ndarray:
        # libsvm works in float64: convert the rows once here, not again inside fit/predict
        return np.ascontiguousarray(self.x[split][rows], dtype=np.float64)

    def train_kernel(self, gamma: float, rows: np.ndarray) -> Optional[np.ndarray]:
        """The RBF kernel of these training rows, to share between fits with other C; None where
        it is too big to compute up front (``fit`` then uses libsvm's own)."""
        from sklearn.metrics.pairwise import rbf_kernel

        if len(rows) ** 2 * 8 > PRECOMPUTE_MAX_BYTES:
            return None
        return rbf_kernel(self._rows("train", rows), gamma=gamma)

    def fit(self, c: float, gamma: float, rows: np.ndarray, kernel: Optional[np.ndarray] = None) -> Any:
        """``kernel``: ``train_kernel(gamma, rows)`` when the caller already has it."""
        from sklearn.svm import SVC

        y = self.y["train"][rows]
        if kernel is None:
            kernel = self.train_kernel(gamma, rows)
        if kernel is None:
            return _multiclass(SVC(C=c, gamma=gamma, kernel="rbf", cache_size=CACHE_MB),
                               self.multiclass).fit(self._rows("train", rows), y)
        # a precomputed kernel is a lookup: libsvm's default cache is plenty, and saves memory; the
        # one-vs-rest SVCs all read the one kernel of the fold
        svc = _multiclass(SVC(C=c, kernel="precomputed"), self.multiclass).fit(kernel, y)
        support = _support(svc)
        return PrecomputedModel(svc, gamma, support, self._rows("train", rows[support]), len(rows))

    def predict(self, model: Any, split: str, rows: Any = slice(None)) -> np.ndarray:
        from sklearn.metrics.pairwise import rbf_kernel

        x = self._rows(split, rows)
        if not isinstance(model, PrecomputedModel):
            return _predicted(model, x)
        # libsvm reads only the support vectors' columns: compute those, leave the rest zero
        kernel = np.zeros((len(x), model.n_train))
        kernel[:, model.support] = rbf_kernel(x, model.support_x, gamma=model.gamma)
        return _predicted(model.svc, kernel)

    def n_support(self, model: Any) -> int:
        """Distinct support vectors over the binary SVCs."""
        return int(len(model.support) if isinstance(model, PrecomputedModel) else len(_support(model)))


@dataclass
class OneVsRestModel:
    """One binary cuML SVC per class on the device (class k against the rest), as the reference's
    cuML ``multiclass_strategy="ovr"`` fitted them through scikit-learn's ``OneVsRestClassifier``:
    the class of the largest decision value wins."""

    classes: np.ndarray  # on the host: the fit's classes, in increasing order
    svcs: List[Any]  # one binary SVC per class (a single one for two classes, as scikit-learn)


class CumlBackend:
    """cuML's SVC on the worker's one GPU; the data lives on the device for the worker's life.

    One-vs-rest is fitted here, one binary ``cuml.svm.SVC`` per class on device arrays: cuML's
    own multiclass SVC (``decision_function_shape``; ``multiclass_strategy`` is gone since 25.06)
    hands the fold to scikit-learn's wrapper on the host and each binary SVC copies its rows back,
    once per class. The fold's rows are gathered once, column-major as cuML's SVC takes them, so
    no binary fit copies them again.
    """

    name = "cuml"

    def __init__(self, data: Dataset, multiclass: str = "ovr"):
        import cupy as cp
        from cuml.svm import SVC  # here, once: a cuML that cannot be imported fails the worker's setup, not each fit

        self.multiclass = multiclass
        self.cp, self.svc_class = cp, SVC
        self.x = {"train": cp.asarray(standardise(data.x_train)), "test": cp.asarray(standardise(data.x_test))}
        # labels in the pixels' dtype, as cuML 25.06's fit converts them (check_dtype=X.dtype); 26.02 encodes any
        # labels to class indexes itself (preprocess_labels), its classes_ keeping these float values
        self.y = {"train": cp.asarray(data.y_train.astype(np.float64)), "test": cp.asarray(data.y_test.astype(np.float64))}
        self.truth = {"train": data.y_train, "test": data.y_test}  # labels on the host, to score predictions

    def train_kernel(self, gamma: float, rows: np.ndarray) -> None:
        """cuML computes its kernel on the GPU itself: nothing to share."""
        return None

    def _gather(self, split: str, rows: Any) -> Any:
        """These rows of a split, on the device, column-major (cuML's SVC converts to that order)."""
        index = rows if isinstance(rows, slice) else self.cp.asarray(rows)
        return self.cp.asfortranarray(self.x[split][index])

    def fit(self, c: float, gamma: float, rows: np.ndarray, kernel: None = None) -> Any:
        cp, SVC = self.cp, self.svc_class
        x, y = self._gather("train", rows), self.y["train"][cp.asarray(rows)]
        settings = {"C": c, "gamma": gamma, "kernel": "rbf", "cache_size": CACHE_MB}
        if self.multiclass == "ovo":
            return SVC(**settings, decision_function_shape="ovo").fit(x, y)
        classes = cp.unique(y)
        positive = classes[1:] if len(classes) == 2 else classes
        svcs = [SVC(**settings).fit(x, (y == k).astype(x.dtype)) for k in positive]
        return OneVsRestModel(cp.asnumpy(classes).astype(np.int64), svcs)

    def predict(self, model: Any, split: str, rows: Any = slice(None)) -> np.ndarray:
        cp, x = self.cp, self._gather(split, rows)
        if not isinstance(model, OneVsRestModel):
            return np.rint(cp.asnumpy(cp.asarray(model.predict(x)))).astype(np.int64)
        scores = cp.stack([cp.asarray(svc.decision_function(x)).ravel() for svc in model.svcs], axis=1)
        if len(model.classes) == 2:
            return model.classes[cp.asnumpy(scores[:, 0] > 0).astype(np.int64)]
        return model.classes[cp.asnumpy(last_argmax(scores, cp))]  # a tie to the later class, as the reference

    def n_support(self, model: Any) -> int:
        """Distinct support vectors (row indexes into the fit's rows) over the binary SVCs; cuML's
        one-vs-one ``support_`` joins the pairwise models' indexes, so count distinct rows there too."""
        cp = self.cp
        svcs = model.svcs if isinstance(model, OneVsRestModel) else [model]
        return int(cp.unique(cp.concatenate([cp.asarray(svc.support_).ravel() for svc in svcs])).size)


def make_backend(data: Dataset, use_cuml: bool, multiclass: str = "ovr") -> Any:
    """cuML where the app chose it (a GPU worker with cuML installed, decided once in
    ``validate``); scikit-learn otherwise."""
    return CumlBackend(data, multiclass) if use_cuml else SklearnBackend(data, multiclass)

