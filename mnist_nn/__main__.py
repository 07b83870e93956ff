"""python -m mnist_nn n_bootstrap n_tuning [--dataset ...] [engine flags]"""
from common import defer_stop_signals

defer_stop_signals()  # before the slow imports: Ctrl-C meanwhile ends the run quietly, not in a traceback

from common import main  # noqa: E402
from mnist_nn.app import MnistNN  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(MnistNN))
