"""The reference's training loop in plain PyTorch, on data that already lives on the device.

As the reference's ``train_model``: ``Net``, ``nn.CrossEntropyLoss``, ``torch.optim.SGD(lr,
momentum)``, batches of 10 walked in the same order every epoch, an epoch's loss the sum of its
batches' mean losses, and a stop once it is above 0.8 x the previous one's. ``epoch_loss="mean"``
(``--epoch-loss mean``) is the per-image mean instead, stopping once not below 0.8 x. What makes it fast leaves the algorithm alone: the data set is
one tensor on the worker's device, loaded once; a batch is an index gather from it (no DataLoader,
PIL or per-sample Python); the epoch's loss and errors are summed on the device and read once an
epoch, so a GPU is never synchronised inside the batch loop; evaluation runs in large batches.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from common import Dataset, resize_images

from .model import Net
from .search import IMAGE_SIZE, TRAIN_BYTES_PER_WEIGHT, Candidate

#: stop when an epoch's loss is above this share of the previous epoch's (the reference's rule)
TOLERANCE = 0.8
#: ``on_epoch(entry)``: the log entry of the epoch that just ended
EpochHook = Callable[[Dict[str, Any]], None]
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


def normalisation(dataset: Dataset, how: str = "reference") -> Tuple[float, float]:
    """(mean, std) to scale pixels on 0-1 with: the reference's (0.5, 1), or with ``how="data"`` the
    training pixels' own (MNIST's 0.1307/0.3081)."""
    if how == "reference":
        return 0.5, 1.0
    pixels = dataset.x_train.astype(np.float64) / 255.0
    return float(pixels.mean()), float(pixels.std())


def to_model_input(images: np.ndarray, mean: float, std: float, device: str = "cpu") -> torch.Tensor:
    """uint8 (n, h, w) images -> normalised float32 (n, 1, 28, 28), as ToTensor + Normalize would."""
    if images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        images = resize_images(images, IMAGE_SIZE)
    tensor = torch.from_numpy(np.ascontiguousarray(images)).to(device)
    return ((tensor.float() / 255.0 - mean) / std).unsqueeze(1).contiguous()


def to_device(dataset: Dataset, device: str, normalise: str = "reference") -> DeviceData:
    """Put a whole data set on ``device`` once (one tensor per part), scaled as ``normalise`` says."""
    mean, std = normalisation(dataset, normalise)
    return DeviceData(
        x_train=to_model_input(dataset.x_train, mean, std, device),
        y_train=torch.from_numpy(dataset.y_train).to(device),
        x_test=to_model_input(dataset.x_test, mean, std, device),
        y_test=torch.from_numpy(dataset.y_test).to(device),
        mean=mean, std=std,
    )


def use_fixed_cublas_workspace() -> None:
    """cuBLAS's fixed workspace, which deterministic algorithms need: read when cuBLAS first
    allocates one, so set before any GPU work (a user's own setting wins)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def make_reproducible() -> Callable[[], None]:
    """The same seed gives the same bits, on a GPU too: deterministic algorithms (a warning where an
    operation has none), no cuDNN autotuner, full float32 (no TF32 in cuBLAS's products or cuDNN's
    convolutions). One place for the settings every fit runs under: the workers, make gpu-check
    and the benchmarks, which measure what runs do. Returns what puts torch's settings back."""
    use_fixed_cublas_workspace()
    backends = torch.backends
    deterministic, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    flags = backends.cudnn.benchmark, backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32
    torch.use_deterministic_algorithms(True, warn_only=True)
    backends.cudnn.benchmark = backends.cudnn.allow_tf32 = backends.cuda.matmul.allow_tf32 = False

    def restore() -> None:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        backends.cudnn.benchmark, backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32 = flags

    return restore


def keep_freed_memory() -> None:
    """CPU only: let glibc reuse freed big blocks instead of unmapping them.

    A big net's gradient (tens of MB) is freed and allocated again every SGD step; by default
    each allocation is a fresh mmap whose page faults cost a good share of the step.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)  # M_MMAP_MAX: no mmap for big blocks, use the heap
        libc.mallopt(-1, 2 ** 30)  # M_TRIM_THRESHOLD: keep up to 1 GiB of freed heap
    except (OSError, AttributeError):
        pass  # not glibc: nothing to tune


def new_net(candidate: Candidate, init_seed: int, device: torch.device) -> Net:
    """PyTorch's default initial weights under ``torch.manual_seed(init_seed)``, drawn on the CPU
    (the same on any device), then moved to ``device``."""
    torch.manual_seed(init_seed)
    return candidate.build().to(device)


def require_gpu_room(candidate: Candidate, device: torch.device) -> None:
    """Fail at once, saying why, where ``candidate`` cannot train on the GPU ``device``, rather than
    with CUDA's out-of-memory error partway through (the reference's search draws nets of up to
    1.46 billion weights: 16 GiB to train one)."""
    free, _ = torch.cuda.mem_get_info(device)
    available = free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    need = candidate.n_weights * TRAIN_BYTES_PER_WEIGHT
    if need > available:
        raise MemoryError(f"a net of {candidate.n_weights / 1e6:.0f}M weights ({candidate.describe()}) needs about "
                          f"{need / 2**30:.1f} GiB of GPU memory to train; {device} has {available / 2**30:.1f} GiB free")


def should_stop(loss: float, previous: float, epoch: int, max_epochs: int, rule: str = "reference") -> bool:
    """The reference's rule: stop once an epoch's loss is above ``TOLERANCE`` x the previous epoch's
    (``rule="mean"``: not below, so equal stops too), or at ``max_epochs``. Unlike the reference
    (where NaN compares false and the fit runs all its epochs), a loss that is not finite stops."""
    if not math.isfinite(loss) or epoch >= max_epochs:
        return True
    return loss > previous * TOLERANCE if rule == "reference" else loss >= previous * TOLERANCE


def train_epoch(net: Net, optimizer: torch.optim.Optimizer, loss_function: torch.nn.Module, x: torch.Tensor,
                y: torch.Tensor, batches: Tuple[torch.Tensor, ...], epoch_loss: str = "reference",
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """One epoch's batch loop: returns the epoch's loss sum and wrong predictions as device tensors,
    unread, so nothing in here waits for the GPU (a function of its own so that checks can watch
    exactly this loop for synchronisations: ``make gpu-check``, tests/test_mnist_nn_train.py)."""
    loss_sum = torch.zeros((), device=x.device)  # summed on the device: read once, after the epoch
    wrong = torch.zeros((), dtype=torch.long, device=x.device)
    for rows in batches:
        images, labels = x.index_select(0, rows), y.index_select(0, rows)
        logits = net(images)
        loss = loss_function(logits, labels)  # the batch's mean, as the reference's
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach() if epoch_loss == "reference" else loss.detach() * len(rows)
        wrong += (logits.argmax(1) != labels).sum()
    return loss_sum, wrong


def fit(x: torch.Tensor, y: torch.Tensor, index: np.ndarray, candidate: Candidate, max_epochs: int,
        batch_size: int, init_seed: int, on_epoch: Optional[EpochHook] = None,
        epoch_loss: str = "reference") -> Tuple[Net, List[Dict[str, Any]]]:
    """Train a new net on ``x[index]``, ``y[index]``, walked in order ``batch_size`` at a time each
    epoch; returns the net (eval mode) and one log entry per epoch, each also given to ``on_epoch``.
    ``epoch_loss``: how an epoch's (and a validation fold's) loss is counted: "reference", the sum of
    the batches' mean losses, or "mean", over images (comparable between folds of different sizes)."""
    if x.device.type == "cuda":
        require_gpu_room(candidate, x.device)
    net = new_net(candidate, init_seed, x.device)
    optimizer = torch.optim.SGD(net.parameters(), lr=candidate.learning_rate, momentum=candidate.momentum)
    loss_function = torch.nn.CrossEntropyLoss()
    batches = torch.as_tensor(index, device=x.device).split(batch_size)
    log: List[Dict[str, Any]] = []
    previous = math.inf
    net.train()
    for epoch in range(1, max_epochs + 1):
        start = time.perf_counter()
        loss_sum, wrong = train_epoch(net, optimizer, loss_function, x, y, batches, epoch_loss)
        value = float(loss_sum) if epoch_loss == "reference" else float(loss_sum) / len(index)
        seconds = time.perf_counter() - start
        log.append({"epoch": epoch, "loss": value if math.isfinite(value) else None,
                    "error": int(wrong) / len(index), "samples_per_s": len(index) / seconds, "seconds": seconds,
                    "lr": candidate.learning_rate})
        if on_epoch is not None:
            on_epoch(log[-1])
        if should_stop(value, previous, epoch, max_epochs, epoch_loss):
            break
        previous = value
    return net.eval(), log


def eval_batch_size(net: Net) -> int:
    """Images per evaluation batch so the conv activations stay under ``EVAL_BYTES``."""
    return int(max(1, min(4096, EVAL_BYTES // (net.hidden.in_features * 4))))


@torch.inference_mode()
def predict_logits(net: Net, x: torch.Tensor) -> torch.Tensor:
    """Logits for every image of ``x``, in large batches."""
    net.eval()
    return torch.cat([net(part) for part in x.split(eval_batch_size(net))])


def evaluate(net: Net, x: torch.Tensor, y: torch.Tensor, batch_size: Optional[int] = None) -> Dict[str, float]:
    """Cross-entropy and error rate of ``net`` on (x, y) (in float64). The loss is the mean over
    images, or with ``batch_size`` the reference's validation loss: the sum of the mean losses of
    consecutive batches of that size (the last may be shorter)."""
    logits = predict_logits(net, x)
    losses = torch.nn.functional.cross_entropy(logits, y, reduction="none").double()
    loss = losses.mean() if batch_size is None else sum(part.mean() for part in losses.split(batch_size))
    return {"loss": float(loss), "error": float((logits.argmax(1) != y).double().mean())}
