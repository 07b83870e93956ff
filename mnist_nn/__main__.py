"""python -m mnist_nn n_bootstrap n_tuning [--dataset ...] [engine flags]"""
from common.runner import main

from mnist_nn.app import MnistNN

if __name__ == "__main__":
    raise SystemExit(main(MnistNN))
