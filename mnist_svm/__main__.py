"""``python -m mnist_svm``: the grid search under the engine (one MPI rank per node)."""
from common import defer_stop_signals

defer_stop_signals()  # before the slow imports: Ctrl-C meanwhile ends the run quietly, not in a traceback

from common import main  # noqa: E402
from mnist_svm.app import MnistSvm  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(MnistSvm))
