"""A stand-in for torchvision (tests only: the real one cannot download here, offline): it imports
torch as the real one does, and its MNIST "downloads" sklearn's digits, blown up to 28x28, as the
four IDX files of ``ROOT/MNIST/raw``."""
import os

import torch  # noqa: F401  (as the real torchvision: importing it imports torch)

if os.environ.get("FAKE_TORCHVISION_IMPORTS"):  # a line per process that imports it: tests count them
    with open(os.environ["FAKE_TORCHVISION_IMPORTS"], "a") as imports:
        imports.write(f"{os.getpid()}\n")

from . import datasets  # noqa: F401
