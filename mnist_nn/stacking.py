"""Which nets of one candidate train side by side (see ``stacked``), and how many at once.

Torch-free where rank 0 uses it (``stacks_on_cpu``, to group the work items); ``stack_size`` and
``require_gpu_room``, called on workers, import torch (and ask it for a GPU's memory).
"""
from __future__ import annotations

from typing import Any

from .search import Candidate

#: on a CPU, K nets train faster stacked than one after the other only while all their weights and
#: momenta stay in cache (measured, benchmarks/bench_nn.py: 22k-weight nets 1.4x faster as 5, 296k-weight
#: nets 1.7x slower); past this many weights in all, they train one at a time
CPU_STACK_WEIGHTS = 250_000
#: share of a GPU's memory a stack may take (evaluation and the data take the rest)
GPU_STACK_SHARE = 0.4
#: GPU bytes per weight of each stacked net at the peak: weights and momentum (8), the trained
#: net's copy (4), the new store ``keep`` builds while the old one lives (8), a net's saved slot
#: while others finish their epoch (8, at most)
GPU_BYTES_PER_WEIGHT = 28
#: the same for one net training alone: weights and momentum (8), the trained net's copy (4)
GPU_BYTES_PER_WEIGHT_ALONE = 12


def stacks_on_cpu(candidate: Candidate, k: int) -> bool:
    """Whether ``k`` nets of ``candidate`` train faster together than one after the other on a CPU."""
    return k * candidate.n_weights <= CPU_STACK_WEIGHTS


def stack_size(candidate: Candidate, k: int, device: Any) -> int:
    """How many of ``k`` nets of ``candidate`` to train in one stack on ``device`` (a torch device):
    on a CPU all of them where ``stacks_on_cpu``, else 1; on a GPU as many as fit in
    ``GPU_STACK_SHARE`` of the memory this process can have (``GPU_BYTES_PER_WEIGHT``; the
    activations at batch size 10 are small beside them): what the driver has free, plus what
    torch's allocator holds unused, so another process on the GPU is left its share."""
    import torch

    device = torch.device(device)
    if device.type == "cpu":
        return k if stacks_on_cpu(candidate, k) else 1
    budget = GPU_STACK_SHARE * gpu_memory_available(device)
    return int(max(1, min(k, budget // (candidate.n_weights * GPU_BYTES_PER_WEIGHT))))


def gpu_memory_available(device: Any) -> int:
    """Bytes this process can still have on the GPU ``device``: what the driver has free, plus
    what torch's allocator holds unused (another process's memory is not ours to count)."""
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def require_gpu_room(candidate: Candidate, device: Any) -> None:
    """Fail at once, saying why, where even one net of ``candidate`` cannot train on the GPU
    ``device``, rather than with CUDA's out-of-memory error partway through (the reference's
    search draws nets of up to 1.46 billion weights: 16 GiB to train one)."""
    need, available = candidate.n_weights * GPU_BYTES_PER_WEIGHT_ALONE, gpu_memory_available(device)
    if need > available:
        raise MemoryError(f"a net of {candidate.n_weights / 1e6:.0f}M weights ({candidate.n_conv_layer} conv "
                          f"{candidate.kernel_size}x{candidate.kernel_size}, {candidate.n_hidden_layer} hidden) "
                          f"needs about {need / 2**30:.1f} GiB of GPU memory to train; {device} has "
                          f"{available / 2**30:.1f} GiB free")
