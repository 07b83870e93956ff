"""``python -m mnist_svm``: the grid search under the engine (one MPI rank per node)."""
from common.runner import main

from .app import MnistSvm

if __name__ == "__main__":
    raise SystemExit(main(MnistSvm))
