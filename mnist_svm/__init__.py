"""Cross-validated grid search of an RBF SVM, one (C, gamma, fold) fit per work item.

Run it with ``python -m mnist_svm N_TUNING [options]`` (under ``mpiexec``/``srun`` for many nodes).
"""
from .app import MnistSvm

__all__ = ["MnistSvm"]
