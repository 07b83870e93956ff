"""Training on data that already lives on the device: no DataLoader, no per-sample Python.

A fit gathers its (bootstrap) training images once into one contiguous tensor; the
mini-batches of every epoch are then zero-copy views of it (the reference, too, walks the
bootstrap sample in the same order every epoch). Losses and outputs stay on the device until
the epoch ends, so a GPU is never synchronised inside the batch loop.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from common.data import Dataset, resize_images

from .model import IMAGE_SIZE, Candidate, Net

#: stop when an epoch's loss is not below this share of the previous epoch's (the reference's rule)
TOLERANCE = 0.8
#: bytes of conv activations one evaluation batch may take
EVAL_BYTES = 256 * 2 ** 20


@dataclass
class DeviceData:
    """The normalised training and test images and labels, on one device."""

    x_train: torch.Tensor  # float32 (n, 1, 28, 28)
    y_train: torch.Tensor  # int64 (n,)
    x_test: torch.Tensor
    y_test: torch.Tensor
    mean: float
    std: float

    @property
    def device(self) -> torch.device:
        return self.x_train.device


def normalisation(dataset: Dataset) -> Tuple[float, float]:
    """Mean and standard deviation of the training pixels on 0-1 (MNIST's 0.1307/0.3081)."""
    pixels = dataset.x_train.astype(np.float64) / 255.0
    return float(pixels.mean()), float(pixels.std())


def keep_freed_memory() -> None:
    """CPU only: let glibc reuse freed big blocks instead of unmapping them.

    A big candidate's gradient (tens of MB) is freed and allocated again every SGD step; by
    default each allocation is a fresh mmap whose page faults cost about a third of the step.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)  # M_MMAP_MAX: no mmap for big blocks, use the heap
        libc.mallopt(-1, 2 ** 30)  # M_TRIM_THRESHOLD: keep up to 1 GiB of freed heap
    except (OSError, AttributeError):
        pass  # not glibc: nothing to tune


def to_model_input(images: np.ndarray, mean: float, std: float, device: str = "cpu") -> torch.Tensor:
    """uint8 (n, h, w) images -> normalised float32 (n, 1, 28, 28), as ToTensor + Normalize would."""
    if images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        images = resize_images(images, IMAGE_SIZE)
    tensor = torch.from_numpy(np.ascontiguousarray(images)).to(device)
    return ((tensor.float() / 255.0 - mean) / std).unsqueeze(1).contiguous()


def to_device(dataset: Dataset, device: str) -> DeviceData:
    """Put a whole data set on ``device`` once (one tensor per part)."""
    mean, std = normalisation(dataset)
    return DeviceData(
        x_train=to_model_input(dataset.x_train, mean, std, device),
        y_train=torch.from_numpy(dataset.y_train).to(device),
        x_test=to_model_input(dataset.x_test, mean, std, device),
        y_test=torch.from_numpy(dataset.y_test).to(device),
        mean=mean, std=std,
    )


def fit(x: torch.Tensor, y: torch.Tensor, index: np.ndarray, candidate: Candidate, max_epochs: int,
        batch_size: int) -> Tuple[Net, List[Dict[str, float]]]:
    """SGD with momentum on ``x[index]`` in batches of ``batch_size``; returns the net and its epoch log.

    The caller seeds torch first: the initial weights are the only random part.
    """
    net = candidate.build().to(x.device)
    optimizer = torch.optim.SGD(net.parameters(), lr=candidate.learning_rate, momentum=candidate.momentum)
    rows = torch.from_numpy(np.asarray(index, dtype=np.int64)).to(x.device)
    inputs, labels = x.index_select(0, rows), y.index_select(0, rows)
    batches = list(zip(inputs.split(batch_size), labels.split(batch_size)))
    n = len(rows)
    log: List[Dict[str, float]] = []
    previous = math.inf
    net.train()
    for epoch in range(1, max_epochs + 1):
        start = time.perf_counter()
        losses, outputs = [], []
        for batch_x, batch_y in batches:
            output = net(batch_x)
            loss = F.cross_entropy(output, batch_y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            outputs.append(output.detach())
        sizes = torch.tensor([len(b) for b, _ in batches], dtype=torch.float32, device=x.device)
        epoch_loss = float((torch.stack(losses) * sizes).sum()) / n
        error = float((torch.cat(outputs).argmax(1) != labels).float().mean())
        seconds = time.perf_counter() - start
        log.append({"epoch": epoch, "loss": epoch_loss if math.isfinite(epoch_loss) else None, "error": error, "samples_per_s": n / seconds,
                    "seconds": seconds, "lr": candidate.learning_rate})
        if not math.isfinite(epoch_loss) or epoch_loss > previous * TOLERANCE:
            break
        previous = epoch_loss
    net.eval()
    return net, log


def eval_batch_size(net: Net) -> int:
    """Images per evaluation batch so the conv activations stay under ``EVAL_BYTES``."""
    per_image = net.hidden.in_features * 4
    return int(max(1, min(4096, EVAL_BYTES // per_image)))


@torch.no_grad()
def predict_logits(net: Net, x: torch.Tensor) -> torch.Tensor:
    """Logits for every image of ``x``, in large batches."""
    net.eval()
    size = eval_batch_size(net)
    return torch.cat([net(part) for part in x.split(size)])


def evaluate(net: Net, x: torch.Tensor, y: torch.Tensor) -> Dict[str, float]:
    """Mean cross-entropy and error rate of ``net`` on (x, y)."""
    logits = predict_logits(net, x)
    return {"loss": float(F.cross_entropy(logits, y)), "error": float((logits.argmax(1) != y).float().mean())}
