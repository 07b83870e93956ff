"""Training on data that already lives on the device: no DataLoader, no per-sample Python.

Each step gathers its images by index from the data set's one tensor on the device (the
reference, too, walks the bootstrap sample in the same order every epoch). The K folds of a
candidate train together (``fit_group``, see ``stacked``): one step does all K nets at once,
without autograd or torch.optim. Losses and predictions stay on the device until the epoch
ends, so a GPU is never synchronised inside the batch loop.
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from common.data import Dataset, resize_images

from .blocked import BlockedNet, BlockRunner
from .model import Net, net_holding
from .search import IMAGE_SIZE, N_CLASSES, Candidate
from .stacked import NetStack
from .stacking import require_gpu_room

#: stop when an epoch's loss is not below this share of the previous epoch's (the reference's rule)
TOLERANCE = 0.8
#: ``on_epoch(k, entry)``: net k's log entry of the epoch that just ended
EpochHook = Callable[[int, Dict[str, Any]], None]
#: bytes of conv activations one evaluation batch may take
EVAL_BYTES = 256 * 2 ** 20
#: most images in one evaluation batch on a CPU, where the batches are shared out over threads
CPU_EVAL_ROWS = 128


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


def initial_state(candidate: Candidate, init_seed: int, device: torch.device) -> Dict[str, torch.Tensor]:
    """Net's PyTorch default initial weights under ``torch.manual_seed(init_seed)`` (drawn on the CPU)."""
    torch.manual_seed(init_seed)
    return {name: tensor.to(device) for name, tensor in candidate.build().state_dict().items()}


def net_from_state(candidate: Candidate, state: Dict[str, torch.Tensor]) -> Net:
    """A Net in eval mode, for scoring, holding ``state``'s tensors themselves (``model.net_holding``),
    without gradients: a trained state is made of inference tensors."""
    return net_holding(state, candidate.n_conv_layer, candidate.kernel_size, candidate.n_hidden_layer,
                       trainable=False).eval()


def epoch_plan(indexes: Sequence[np.ndarray], batch_size: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows, per-sample weights and validity of every step, shape (steps, K, batch_size).

    Net k walks its own rows in order, ``batch_size`` at a time; a last, shorter batch is
    padded (row 0, weight 0) and weighs its real samples 1/its size, so its gradient is the
    mean over the samples it has, as a DataLoader's last batch would give.
    """
    sizes = [len(index) for index in indexes]
    steps = max(-(-n // batch_size) for n in sizes)
    rows = np.zeros((len(indexes), steps * batch_size), dtype=np.int64)
    weight = np.zeros(rows.shape, dtype=np.float32)
    for k, index in enumerate(indexes):
        n = len(index)
        rows[k, :n] = index
        counts = np.minimum(batch_size, n - np.arange(0, n, batch_size))
        weight[k, :n] = np.repeat(1.0 / counts.astype(np.float64), counts).astype(np.float32)
    shape = (len(indexes), steps, batch_size)
    as_steps = lambda a: np.ascontiguousarray(a.reshape(shape).transpose(1, 0, 2))  # noqa: E731
    return as_steps(rows), as_steps(weight), as_steps(weight > 0)


def should_stop(loss: float, previous: float, epoch: int, max_epochs: int) -> bool:
    """The reference's rule: stop once an epoch's loss is not below ``TOLERANCE`` x the previous
    epoch's (equal stops too), on a loss that is not finite, or at ``max_epochs``."""
    return not math.isfinite(loss) or loss >= previous * TOLERANCE or epoch >= max_epochs


def idle_nets(steps: np.ndarray, device: torch.device) -> Dict[int, torch.Tensor]:
    """For each step some stacked nets sit out (they have fewer batches), their stack rows, on the
    device: made outside the epochs' loops, so no index crosses to a GPU (a sync) inside them."""
    return {s: torch.as_tensor(np.flatnonzero(steps <= s), device=device)
            for s in range(int(steps.min()), int(steps.max()))}


def fit_group(x: torch.Tensor, y: torch.Tensor, indexes: Sequence[np.ndarray], candidate: Candidate,
              max_epochs: int, batch_size: int, init_seeds: Sequence[int], batched: Optional[bool] = None,
              on_epoch: Optional[EpochHook] = None) -> List[Tuple[Dict[str, torch.Tensor], List[Dict[str, Any]]]]:
    """Train one net per index array (K nets of one candidate) in lockstep; per net (state dict, epoch log).

    Net k starts from ``initial_state(candidate, init_seeds[k])``, walks ``x[indexes[k]]`` in
    order each epoch and stops on its own, by the reference's rule, when an epoch's loss is not
    below ``TOLERANCE`` x the previous one's, or after ``max_epochs``; the others go on. A net
    gets the same bits whether it trains alone or in a group (see ``stacked``).

    On a CPU every product runs on one BLAS thread, so the bits never depend on the thread count:
    one net trains block by block on the worker's threads (``blocked``); a stack (small nets only,
    ``stacking.stack_size``) trains on one thread, its products batched. A net of one block (up to
    ``blocked.BLOCK_WEIGHTS`` hidden weights: every net ``stacking.stack_size`` stacks on a CPU) gets the
    bits it would get in a stack. ``batched`` (tests, benchmarks) asks for a plain ``NetStack`` in
    that mode, on torch's threads. ``on_epoch(k, entry)`` sees each epoch's log entry of net k as
    soon as the epoch ends (the app logs them: long fits show their progress in the worker's log).
    """
    cpu, single = x.device.type == "cpu" and batched is None, len(indexes) == 1
    if x.device.type == "cuda":
        require_gpu_room(candidate, x.device)
    with (BlockRunner(torch.get_num_threads() if single else 1) if cpu else nullcontext()) as runner:
        if cpu and single:
            stack = BlockedNet(initial_state(candidate, init_seeds[0], "cpu"), x.shape[-1], batch_size,
                               candidate.learning_rate, candidate.momentum, runner)
        else:
            stack = NetStack((initial_state(candidate, seed, "cpu") for seed in init_seeds), len(indexes),
                             x.shape[-1], batch_size, candidate.learning_rate, candidate.momentum, x.device,
                             batched=True if cpu else batched)
        return _train(stack, x, y, indexes, candidate, max_epochs, batch_size, on_epoch)


def _train(stack: NetStack, x: torch.Tensor, y: torch.Tensor, indexes: Sequence[np.ndarray], candidate: Candidate,
           max_epochs: int, batch_size: int,
           on_epoch: Optional[EpochHook]) -> List[Tuple[Dict[str, torch.Tensor], List[Dict[str, Any]]]]:
    """``fit_group``'s epoch loop on a stack already built."""
    device, K = x.device, len(indexes)
    rows_np, weight_np, valid = epoch_plan(indexes, batch_size)
    n_steps = rows_np.shape[0]
    sizes = np.array([len(index) for index in indexes])
    labels_np = y.cpu().numpy()[rows_np]
    on = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    plan = {"rows": on(rows_np), "weight": on(weight_np).unsqueeze(-1), "label": on(labels_np).unsqueeze(-1),
            "onehot": F.one_hot(on(labels_np), N_CLASSES).float()}
    step_args = plan
    alive = list(range(K))  # original number of each stacked net
    steps_of = -(-sizes // batch_size)
    idle = idle_nets(steps_of[alive], device)
    logs: List[List[Dict[str, Any]]] = [[] for _ in range(K)]
    finals: List[Optional[Dict[str, torch.Tensor]]] = [None] * K
    previous = np.full(K, math.inf)
    with torch.inference_mode():
        for epoch in range(1, max_epochs + 1):
            picked = torch.empty(n_steps, len(alive), batch_size, 1, device=device)
            predicted = torch.empty(n_steps, len(alive), batch_size, dtype=torch.long, device=device)
            start = time.perf_counter()
            for s in range(max(steps_of[k] for k in alive)):
                saved = stack.store.index_select(0, idle[s]) if s in idle else None
                stack.step(x, step_args["rows"][s].view(-1), step_args["onehot"][s], step_args["weight"][s],
                           step_args["label"][s], picked[s], predicted[s])
                if saved is not None:  # a net past its last batch keeps its state: put it back
                    stack.store.index_copy_(0, idle[s], saved)
            log_prob, guess = picked.squeeze(-1).cpu().numpy(), predicted.cpu().numpy()
            seconds = time.perf_counter() - start
            stopped = []
            for j, k in enumerate(alive):
                mask = valid[:, k]
                loss = float(-np.sum(log_prob[:, j][mask], dtype=np.float64) / sizes[k])
                error = float(np.mean(guess[:, j][mask] != labels_np[:, k][mask]))
                logs[k].append({"epoch": epoch, "loss": loss if math.isfinite(loss) else None, "error": error,
                                "samples_per_s": float(sizes[k] / seconds), "seconds": seconds,
                                "lr": candidate.learning_rate})
                if on_epoch is not None:
                    on_epoch(k, logs[k][-1])
                if should_stop(loss, previous[k], epoch, max_epochs):
                    finals[k] = stack.state_dict(j)
                    stopped.append(j)
                previous[k] = loss
            if stopped:
                keep = [j for j in range(len(alive)) if j not in stopped]
                if not keep:
                    break
                alive = [alive[j] for j in keep]
                stack.keep(keep)
                index = torch.as_tensor(alive, device=device)
                step_args = {name: t.index_select(1, index).contiguous() for name, t in plan.items()}
                idle = idle_nets(steps_of[alive], device)
    return [(finals[k], logs[k]) for k in range(K)]


def fit(x: torch.Tensor, y: torch.Tensor, index: np.ndarray, candidate: Candidate, max_epochs: int,
        batch_size: int, init_seed: int, on_epoch: Optional[EpochHook] = None) -> Tuple[Net, List[Dict[str, Any]]]:
    """One net alone: ``fit_group`` with K=1; returns the net (eval mode) and its epoch log."""
    (state, log), = fit_group(x, y, [index], candidate, max_epochs, batch_size, [init_seed], on_epoch=on_epoch)
    return net_from_state(candidate, state), log


def eval_batch_size(net: Net) -> int:
    """Images per evaluation batch so the conv activations stay under ``EVAL_BYTES``."""
    per_image = net.hidden.in_features * 4
    return int(max(1, min(4096, EVAL_BYTES // per_image)))


@torch.no_grad()
def predict_logits(net: Net, x: torch.Tensor) -> torch.Tensor:
    """Logits for every image of ``x``, in large batches.

    On a CPU the batches (at most ``CPU_EVAL_ROWS`` images, a number fixed by the net's shape) are
    shared out over the worker's threads, each on one BLAS thread, so the logits have the same bits
    whatever the thread count, as the training does.
    """
    net.eval()
    if x.device.type != "cpu":
        return torch.cat([net(part) for part in x.split(eval_batch_size(net))])
    parts = x.split(min(CPU_EVAL_ROWS, eval_batch_size(net)))
    logits: List[Optional[torch.Tensor]] = [None] * len(parts)

    def one(j: int) -> None:
        logits[j] = net(parts[j])

    with BlockRunner(torch.get_num_threads()) as runner:
        runner.run(one, len(parts))
    return torch.cat(logits)


def evaluate(net: Net, x: torch.Tensor, y: torch.Tensor) -> Dict[str, float]:
    """Mean cross-entropy and error rate of ``net`` on (x, y) (means taken in float64, in one order)."""
    logits = predict_logits(net, x)
    losses = F.cross_entropy(logits.float(), y, reduction="none").double().cpu().numpy()
    wrong = (logits.argmax(1) != y).cpu().numpy()
    return {"loss": float(np.sum(losses) / len(losses)), "error": float(np.sum(wrong) / len(wrong))}
