"""One net on a CPU: each SGD step split into fixed blocks of conv channels, run on a few threads.

At batch size 10 the hidden layer's products are skinny (10 rows against conv channels x
positions columns) and MKL runs them on one core whatever the thread count: the 10.5M-weight
net of ``--seed 0`` took 39 ms a step on 1 thread and 29.5 ms on 2. But conv channel c feeds only
the hidden layer's columns c*L..(c+1)*L, so a step splits into independent blocks of channels:

  forward   per block: its conv outputs, their ReLU, and its share of the hidden layer's sum
  middle    the partial sums added in block order, the output layer, the loss (one thread)
  backward  per block: the gradient reaching its hidden columns, their momentum and update,
            the gradient reaching its conv channels, their momentum and update

Each block's hidden weights (about ``BLOCK_WEIGHTS``) stay in cache from the product that reads
them to the update that writes them. The blocks are fixed by the net's shape, never by the thread
count, and every operation runs on one BLAS thread; threads only share out whole blocks. So a net
gets the same bits on 1 thread or 16 (``tests/test_mnist_nn_train.py`` checks it).

The hidden layer's products are ``kernels``' where they can be had (2-3x faster than MKL's on these
skinny shapes: the backward pass's three are one pass over the block); else torch's.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .kernels import HiddenKernels, hidden_kernels
from .stacked import NetStack

#: hidden-layer weights per block (2 MB, 4 MB with their momentum): measured fastest among 2^17..2^21
#: on the development machine (benchmarks/bench_nn.py); a net with fewer takes the whole-net step
BLOCK_WEIGHTS = 2 ** 19


def channel_blocks(channels: int, positions: int, hidden: int) -> List[Tuple[int, int]]:
    """The blocks of conv channels [a, b) a net's step is split into: about ``BLOCK_WEIGHTS``
    hidden weights each (``positions`` x ``hidden`` a channel), fixed by the net's shape alone."""
    per_block = max(1, BLOCK_WEIGHTS // (positions * hidden))
    return [(a, min(channels, a + per_block)) for a in range(0, channels, per_block)]


class BlockRunner:
    """Runs ``fn(j)`` for every block j on ``threads`` threads, thread i doing a fixed contiguous
    share, with torch (MKL, OpenMP) limited to one thread per caller meanwhile.

    Use as a context manager: entering limits the calling thread, leaving restores its count.
    """

    def __init__(self, threads: int):
        self.threads = max(1, int(threads))
        self._pool: Optional[ThreadPoolExecutor] = None
        self._saved = 0

    def __enter__(self) -> "BlockRunner":
        self._saved = torch.get_num_threads()
        torch.set_num_threads(1)
        if self.threads > 1:
            self._pool = ThreadPoolExecutor(self.threads - 1, initializer=torch.set_num_threads, initargs=(1,))
        return self

    def __exit__(self, *exc_info) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        torch.set_num_threads(self._saved)

    def shares(self, n: int) -> List[Tuple[int, int]]:
        """Contiguous, nearly equal ranges of ``range(n)``, one per thread that has work."""
        used = min(self.threads, n)
        cuts = [round(i * n / used) for i in range(used + 1)]
        return list(zip(cuts, cuts[1:]))

    def run(self, fn: Callable[[int], None], n: int) -> None:
        shares = self.shares(n)
        if self._pool is None or len(shares) == 1:
            _run_share(fn, 0, n)
            return
        futures = [self._pool.submit(_run_share, fn, lo, hi) for lo, hi in shares[1:]]
        _run_share(fn, *shares[0])
        for future in futures:
            future.result()


def _run_share(fn: Callable[[int], None], lo: int, hi: int) -> None:
    with torch.inference_mode():  # thread-local: the pool's threads need it too
        for j in range(lo, hi):
            fn(j)


class BlockedNet(NetStack):
    """One net (a stack of K=1) on a CPU whose step runs block by block on ``runner``'s threads.

    Same layout, state dicts and step arguments as ``NetStack``; only the step differs. The hidden
    layer's products are this CPU's ``kernels.hidden_kernels`` where they can be had and
    ``use_kernels``, else torch's.
    """

    def __init__(self, state: Dict[str, torch.Tensor], image_size: int, batch_size: int, learning_rate: float,
                 momentum: float, runner: BlockRunner, use_kernels: bool = True):
        super().__init__([state], 1, image_size, batch_size, learning_rate, momentum, "cpu", batched=True)
        self.runner = runner
        self.kernels: Optional[HiddenKernels] = hidden_kernels() if use_kernels else None
        C, L, H = self.channels, self.positions, self.hidden
        self.blocks = channel_blocks(C, L, H)
        self.partials = torch.empty(len(self.blocks), batch_size, H)
        self.tail = slice(self.offsets["hidden_b"], self.width)  # hidden bias and output layer: updated whole

    def _forward_block(self, j: int) -> None:
        a, b = self.blocks[j]
        L = self.positions
        torch.mm(self.params["conv"][0, a:b], self.patches[0], out=self.conv_out[0, a:b])
        torch.clamp_min(self.conv_out_4d[0, a:b], 0, out=self.hidden_in_4d[0, a:b])
        hidden_in, weight = self.hidden_in[0, :, a * L:b * L], self.params["hidden_w"][0, :, a * L:b * L]
        if self.kernels is not None:
            self.kernels.forward(hidden_in, weight, self.partials[j])
        else:
            torch.mm(hidden_in, weight.t(), out=self.partials[j])

    def _backward_block(self, j: int) -> None:
        a, b = self.blocks[j]
        columns = slice(a * self.positions, b * self.positions)
        m, lr = self.momentum, self.learning_rate
        grad = self.grad_output_in[0]
        weight, velocity = self.params["hidden_w"][0, :, columns], self.velocity["hidden_w"][0, :, columns]
        hidden_in, grad_hidden_in = self.hidden_in[0, :, columns], self.grad_hidden_in[0, :, columns]
        if self.kernels is not None:
            self.kernels.backward(hidden_in, grad, weight, velocity, grad_hidden_in, m, lr)
        else:
            torch.mm(grad, weight, out=grad_hidden_in)
            velocity.addmm_(grad.t(), hidden_in, beta=m, alpha=lr)
            weight.sub_(velocity)
        torch.ops.aten.threshold_backward.grad_input(self.grad_hidden_in_4d[0, a:b], self.conv_out_4d[0, a:b], 0,
                                                     grad_input=self.grad_conv_out_4d[0, a:b])
        conv_velocity = self.velocity["conv"][0, a:b]
        conv_velocity.addmm_(self.grad_conv_out[0, a:b], self.patches[0].t(), beta=m, alpha=lr)
        self.params["conv"][0, a:b].sub_(conv_velocity)

    def step(self, x: torch.Tensor, rows: torch.Tensor, onehot: torch.Tensor, weight: torch.Tensor,
             label: torch.Tensor, picked_log_prob: torch.Tensor, predicted: torch.Tensor) -> None:
        """``NetStack.step`` for one net, block by block (see the module's docstring); a net of one
        block takes ``NetStack.step`` itself, on the runner's one BLAS thread."""
        if len(self.blocks) == 1:
            super().step(x, rows, onehot, weight, label, picked_log_prob, predicted)
            return
        torch.index_select(x, 0, rows, out=self.images)
        self.patch_target.copy_(self.patch_source)
        self.runner.run(self._forward_block, len(self.blocks))
        hidden_out = self.output_in[0]
        hidden_out.copy_(self.params["hidden_b"][0].expand_as(hidden_out))
        for partial in self.partials:  # in block order, whatever thread made each
            hidden_out.add_(partial)
        self._head(onehot, weight, label, picked_log_prob, predicted)
        self._accumulate(self.velocity["hidden_b"], self.ones_b, self.grad_output_in)
        self.runner.run(self._backward_block, len(self.blocks))
        self.flat_params[0, self.tail].sub_(self.flat_velocity[0, self.tail])
