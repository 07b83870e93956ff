"""Cross-validated grid search of an RBF SVM, one (C, gamma, fold) fit per work item.

Run it with ``python -m mnist_svm N_TUNING [options]`` (under ``mpiexec``/``srun`` for many nodes).
The app is ``mnist_svm.app.MnistSvm``; importing this package imports nothing heavy, so that
``python -m mnist_svm`` can defer Ctrl-C before numpy and scikit-learn load.
"""
from typing import Any

__all__ = ["MnistSvm"]


def __getattr__(name: str) -> Any:
    if name == "MnistSvm":
        from .app import MnistSvm

        return MnistSvm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
