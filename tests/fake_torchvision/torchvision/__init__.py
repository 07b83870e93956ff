"""A stand-in for torchvision (tests only: the real one cannot download here, offline): it imports
torch as the real one does, and its MNIST "downloads" sklearn's digits, blown up to 28x28, as the
four IDX files of ``ROOT/MNIST/raw``."""
import torch  # noqa: F401  (as the real torchvision: importing it imports torch)

from . import datasets  # noqa: F401
