"""``cuml.svm.SVC`` as cuML 25.06 and 26.02 define its constructor, fitted with scikit-learn.

The constructor is copied from cuML 26.02 (rapidsai/cuml v26.02.00, python/cuml/cuml/svm/svc.py,
``SVC.__init__``; 25.06's svc.pyx has the same parameters): keyword-only, no ``**kwargs``, so a
keyword the pinned cuML does not take (``multiclass_strategy``, removed in 25.06) is a TypeError.
One-vs-one ``support_`` holds row indexes of the whole training data, as cuML maps each pair's
back (``SVC._fit_multiclass``).
Two classes: one binary SVC, positive decision values for the larger label (cuML encodes labels
to -1/+1 in that order). More: scikit-learn's one-vs-one or one-vs-rest wrapper over binary SVCs
on host copies of the data, chosen by ``decision_function_shape``, as cuML does.
"""
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin

__all__ = ["SVC"]



class SVC(BaseEstimator, ClassifierMixin):
    """Support vector classifier with cuML's constructor and fitted attributes (get_params from
    the constructor's signature, as cuML's ``Base``: scikit-learn's wrappers clone it)."""

    def __init__(
        self,
        *,
        handle=None,
        C=1.0,
        kernel="rbf",
        degree=3,
        gamma="scale",
        coef0=0.0,
        tol=1e-3,
        cache_size=1024.0,
        max_iter=-1,
        nochange_steps=1000,
        verbose=False,
        output_type=None,
        probability=False,
        random_state=None,
        class_weight=None,
        decision_function_shape="ovo",
    ):
        self.handle, self.C, self.kernel, self.degree, self.gamma = handle, C, kernel, degree, gamma
        self.coef0, self.tol, self.cache_size, self.max_iter = coef0, tol, cache_size, max_iter
        self.nochange_steps, self.verbose, self.output_type = nochange_steps, verbose, output_type
        self.probability, self.random_state, self.class_weight = probability, random_state, class_weight
        self.decision_function_shape = decision_function_shape

    @staticmethod
    def _features(X, convert_dtype=True):
        X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError(f"Expected a 2-D array, got shape {X.shape}")
        if X.dtype not in (np.float32, np.float64):
            if not convert_dtype:
                raise TypeError(f"Expected input to be of type float32 or float64, got {X.dtype}")
            X = X.astype(np.float32)
        return X

    def fit(self, X, y, sample_weight=None, *, convert_dtype=True):
        if self.probability:
            raise NotImplementedError("the fake cuML SVC does not fit probabilities")
        X, y = self._features(X, convert_dtype), np.asarray(y)
        if y.ndim != 1 or len(y) != len(X):
            raise ValueError(f"Expected y of {len(X)} rows, got shape {y.shape}")
        self.classes_ = np.unique(y)
        if len(self.classes_) == 1:
            raise ValueError("This solver needs samples of at least 2 classes in the data, but the data "
                             "contains only 1 class")
        self.n_classes_ = len(self.classes_)
        self.shape_fit_ = X.shape
        for name in ("_multiclass", "_binary"):
            self.__dict__.pop(name, None)
        if self.n_classes_ > 2:
            import sklearn.multiclass

            wrappers = {"ovo": sklearn.multiclass.OneVsOneClassifier, "ovr": sklearn.multiclass.OneVsRestClassifier}
            wrapper = wrappers.get(self.decision_function_shape)
            if wrapper is None:
                raise ValueError(f"Expected `decision_function_shape` to be one of {list(wrappers)}, "
                                 f"got {self.decision_function_shape}")
            params = self.get_params()
            params.pop("decision_function_shape")
            self._multiclass = wrapper(SVC(**params)).fit(np.array(X), np.array(y))  # cuML: host copies
            if self.decision_function_shape == "ovo":
                self._align_pairs_support(np.asarray(y))
            self.fit_status_ = 0
            return self
        from sklearn.svm import SVC as LibsvmSVC

        self._binary = LibsvmSVC(C=self.C, kernel=self.kernel, degree=self.degree, gamma=self.gamma,
                                 coef0=self.coef0, tol=self.tol, cache_size=self.cache_size,
                                 max_iter=self.max_iter, class_weight=self.class_weight)
        self._binary.fit(X, y, sample_weight=sample_weight)
        self.support_ = self._binary.support_.astype(np.int32)
        self.support_vectors_ = X[self.support_]
        self.n_support_ = int(len(self.support_))  # cuML: the total (svm_base's support.shape[0]), not per class
        self.dual_coef_ = self._binary.dual_coef_
        self.intercept_ = self._binary.intercept_
        self.fit_status_ = 0
        return self

    def _align_pairs_support(self, y):
        """One-vs-one: each pair's model was fitted on that pair's rows only; its ``support_`` is
        made row indexes of the whole training data, pair by pair in the order of the sorted classes,
        as cuML's ``SVC._fit_multiclass`` does (``cp.nonzero(cond)[0][ovo_support]``)."""
        pairs = iter(self._estimators)
        for i, first in enumerate(self.classes_):
            for second in self.classes_[i + 1:]:
                estimator = next(pairs)
                rows = np.nonzero((y == first) | (y == second))[0]
                estimator.support_ = rows[np.asarray(estimator.support_)]

    @property
    def _estimators(self):
        return self._multiclass.estimators_

    def __getattr__(self, name):
        # cuML's multiclass SVC: support_ joins the binary models' row indexes
        if name == "support_" and "_multiclass" in self.__dict__:
            return np.concatenate([np.asarray(e.support_) for e in self._estimators])
        raise AttributeError(name)

    def decision_function(self, X, *, convert_dtype=True):
        X = self._features(X, convert_dtype)
        if "_multiclass" in self.__dict__:
            return self._multiclass.decision_function(np.array(X))
        if X.shape[1] != self.shape_fit_[1]:
            raise ValueError(f"Expected {self.shape_fit_[1]} columns, got {X.shape[1]}")
        return self._binary.decision_function(X).astype(X.dtype)

    def predict(self, X, *, convert_dtype=True):
        if "_multiclass" in self.__dict__:
            return self._multiclass.predict(np.array(self._features(X, convert_dtype)))
        return self.classes_[(self.decision_function(X, convert_dtype=convert_dtype) >= 0).astype(np.int8)]
