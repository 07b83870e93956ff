"""``torchvision.datasets.MNIST`` and ``FashionMNIST`` as the project meets them, offline.

As torchvision's (0.22 to 0.29, torchvision/datasets/mnist.py): the constructor
``(root, train=True, transform=None, target_transform=None, download=False)``; ``mirrors``; the
files in ``ROOT/<class name>/raw``; ``download=True`` fetches all four files whatever ``train`` is
(each ``.gz`` kept beside its unpacked IDX file); ``download=False`` without them raises
RuntimeError("Dataset not found. ..."); the split's images and labels end in ``data`` and
``targets`` (numpy arrays here, tensors there). What is "fetched" is scikit-learn's digits blown up to 28x28, not MNIST; ``mirrors`` is
the test's local server (FAKE_TORCHVISION_MIRROR), so the project's reachability check passes.
"""
import gzip
import os
import struct
from pathlib import Path

import numpy as np

_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _digits():
    """The four files' arrays: 150 training and 40 test images of the digits, 28x28 uint8."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.pad(np.kron(digits.images * 16, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2))).clip(0, 255)
    images, labels = images.astype(np.uint8), digits.target.astype(np.uint8)
    return dict(zip(_FILES, (images[:150], labels[:150], images[150:190], labels[150:190])))


def _idx(array):
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def _read_idx(path):
    data = Path(path).read_bytes()
    ndim = data[3]
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


class MNIST:
    mirrors = [os.environ.get("FAKE_TORCHVISION_MIRROR", "http://127.0.0.1:9/")]

    def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
        self.root, self.train = root, train
        self.transform, self.target_transform = transform, target_transform
        if download:
            self.download()
        if not self._check_exists():
            raise RuntimeError("Dataset not found. You can use download=True to download it")
        prefix = "train" if train else "t10k"
        self.data = _read_idx(os.path.join(self.raw_folder, f"{prefix}-images-idx3-ubyte"))
        self.targets = _read_idx(os.path.join(self.raw_folder, f"{prefix}-labels-idx1-ubyte"))

    @property
    def raw_folder(self):
        return os.path.join(self.root, self.__class__.__name__, "raw")

    def _check_exists(self):
        return all(os.path.isfile(os.path.join(self.raw_folder, name)) for name in _FILES)

    def download(self):
        if self._check_exists():
            return
        os.makedirs(self.raw_folder, exist_ok=True)
        for name, array in _digits().items():
            data = _idx(np.ascontiguousarray(array))
            Path(self.raw_folder, f"{name}.gz").write_bytes(gzip.compress(data))
            Path(self.raw_folder, name).write_bytes(data)


class FashionMNIST(MNIST):
    mirrors = [os.environ.get("FAKE_TORCHVISION_MIRROR", "http://127.0.0.1:9/")]
