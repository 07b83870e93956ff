"""``torchvision.datasets.MNIST`` as far as the project uses it: ``mirrors`` and the download."""
import gzip
import os
import struct
from pathlib import Path

import numpy as np


class MNIST:
    #: the test's local server (FAKE_TORCHVISION_MIRROR), so the project's reachability check passes
    mirrors = [os.environ.get("FAKE_TORCHVISION_MIRROR", "http://127.0.0.1:9/")]

    def __init__(self, root, train=True, download=False):
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = np.pad(np.kron(digits.images * 16, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2))).clip(0, 255)
        images, labels = images.astype(np.uint8), digits.target
        folder = Path(root) / "MNIST" / "raw"
        folder.mkdir(parents=True, exist_ok=True)
        parts = ({"train-images-idx3-ubyte": images[:150], "train-labels-idx1-ubyte": labels[:150]} if train else
                 {"t10k-images-idx3-ubyte": images[150:190], "t10k-labels-idx1-ubyte": labels[150:190]})
        for stem, array in parts.items():
            header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
            (folder / f"{stem}.gz").write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))
