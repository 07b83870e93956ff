"""K nets of one architecture trained in lockstep, forward and backward written out by hand.

At batch size 10 a training step is a few small matrix products; autograd, ``torch.optim``
and the per-layer dispatch cost more than the arithmetic. Here one step is ~25 tensor calls
for all K nets together: the K nets' parameters live in one buffer with a leading K
dimension (each layer is a view of it), every layer is one batched matrix product over the
K nets, and the whole SGD update is one subtraction over the buffer.

Layout, per net (each piece starts on a 64-byte boundary):
  conv (C, k*k + 1) = [conv.weight | conv.bias], hidden_w (H, C*L), hidden_b (1, H),
  output_w (10, H), output_b (1, 10)
The convolution is one product per net, conv (C, k*k+1) @ patches (k*k+1, B*L), the last
patch row being ones (so the bias and its gradient come with the product). Its output is
(C, B, L); the ReLU writes it transposed to (B, C*L), Net's flatten order, for the hidden
layer, and the backward pass transposes the gradient back inside the ReLU's derivative.

SGD with momentum is kept as ``v = m*v + lr*g; p -= v`` (``v`` is torch.optim's buffer times
the learning rate: the same trajectory up to rounding); ``m*v + lr*g`` is fused into the
matrix product that makes ``g`` (BLAS beta/alpha).

Reproducibility: a net's arithmetic must not depend on how many nets share the stack, so a
fold gives the same bits whether it trained alone or with the other folds. Element-wise
operations and the row-wise softmax are exact per element. Batched matrix products are
per-net identical only where BLAS computes each net's product the same way: measured true
for CPU with one thread. Elsewhere (more threads, CUDA) each net's products are issued one
by one (``batched=False``), same shapes and strides whatever K is.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, Optional, Sequence, Union

import torch

from .search import N_CLASSES

#: each parameter block starts at a multiple of this many floats (64 bytes)
ALIGN = 16
#: each net's parameter row and momentum row start at a multiple of this many floats (256 bytes, as
#: ``_new_per_net``'s buffers): net k of a stack then has each block as aligned as a net alone, and
#: cuBLAS(Lt), which picks its kernel by the pointers' alignment, computes the same way for both
ROW_ALIGN = 64


def _aligned(n: int, align: int = ALIGN) -> int:
    return -(-n // align) * align


def prefer_batched(device: torch.device) -> bool:
    """Whether one batched product over K nets gives each net the bits it would get alone."""
    return torch.device(device).type == "cpu" and torch.get_num_threads() == 1


class NetStack:
    """Parameters and momentum of K same-shaped nets, and one SGD step on all of them."""

    def __init__(self, states: Iterable[Dict[str, torch.Tensor]], count: int, image_size: int, batch_size: int,
                 learning_rate: float, momentum: float, device: Union[str, torch.device],
                 batched: Optional[bool] = None):
        """``count`` nets from ``states`` (Net state dicts on any device), read one at a time so
        that a big net's initial weights are held only once besides the stack."""
        states = iter(states)
        first = next(states)
        conv_w = first["conv.weight"]
        self.channels, self.kernel = conv_w.shape[0], conv_w.shape[-1]
        self.image_size = image_size
        self.side = image_size - self.kernel + 1
        self.positions = self.side * self.side
        self.hidden = first["hidden.weight"].shape[0]
        self.batch_size = batch_size
        self.learning_rate, self.momentum = float(learning_rate), float(momentum)
        self.device = torch.device(device)
        self.batched = prefer_batched(self.device) if batched is None else batched
        C, H, L, kk = self.channels, self.hidden, self.positions, self.kernel ** 2
        self.shapes = {"conv": (C, kk + 1), "hidden_w": (H, C * L), "hidden_b": (1, H),
                       "output_w": (N_CLASSES, H), "output_b": (1, N_CLASSES)}
        self.offsets, offset = {}, 0
        for name, shape in self.shapes.items():
            self.offsets[name] = offset
            offset += _aligned(shape[0] * shape[1])
        self.width = _aligned(offset, ROW_ALIGN)
        self._bind(torch.zeros(count, 2, self.width, device=self.device))
        for k in range(count):
            state = first if k == 0 else next(states)
            first = None
            for name, tensor in self._from_net(state).items():
                self.params[name][k].copy_(tensor)
            del state

    # ----- layout -----
    def _bind(self, store: torch.Tensor) -> None:
        """Views of one store (K, 2, width): row 0 the parameters, row 1 the momentum."""
        self.store = store
        self.K = store.shape[0]
        self.flat_params, self.flat_velocity = store[:, 0], store[:, 1]
        self.params = self._views(self.flat_params)
        self.velocity = self._views(self.flat_velocity)
        K, B, C, H, L, kk = self.K, self.batch_size, self.channels, self.hidden, self.positions, self.kernel ** 2
        s, k, side = self.image_size, self.kernel, self.side
        new = self._new_per_net
        self.images = torch.empty(K * B, 1, s, s, device=self.device)
        self.patches = new(K, kk + 1, B * L)
        self.patches[:, kk].fill_(1.0)
        self.conv_out = new(K, C, B * L)
        self.hidden_in = new(K, B, C * L)
        self.output_in = new(K, B, H)  # the hidden layer's output, ReLU'd in place
        self.logits = new(K, B, N_CLASSES)
        self.log_probs = new(K, B, N_CLASSES)
        self.grad_logits = new(K, B, N_CLASSES)
        self.grad_output_in = new(K, B, H)
        self.grad_hidden_in = new(K, B, C * L)
        self.grad_conv_out = new(K, C, B * L)
        self.ones_b = new(K, 1, B).fill_(1.0)
        # patch (i, j) of image b at position (r, c) is pixel (i + r, j + c): a strided view, copied each step
        self.patch_source = self.images.as_strided((K, k, k, B, side, side), (B * s * s, s, 1, s * s, s, 1))
        self.patch_target = self.patches[:, :kk].view(K, k, k, B, side, side)
        # (K, C, B, L) views of the conv's side and of the hidden layer's side, for the ReLU and its derivative
        self.conv_out_4d = self.conv_out.view(K, C, B, L)
        self.grad_conv_out_4d = self.grad_conv_out.view(K, C, B, L)
        self.hidden_in_4d = self.hidden_in.view(K, B, C, L).transpose(1, 2)
        self.grad_hidden_in_4d = self.grad_hidden_in.view(K, B, C, L).transpose(1, 2)

    def _new_per_net(self, *shape: int) -> torch.Tensor:
        """An empty (K, ...) buffer. Where each net's products are issued one by one (``batched``
        off: CUDA), each net's slice starts on a 256-byte boundary, so BLAS sees the same alignment
        (and may pick the same kernel) for net k of a stack as for a net alone."""
        if self.batched:
            return torch.empty(*shape, device=self.device)
        per_net = math.prod(shape[1:])
        padded = _aligned(per_net, ROW_ALIGN)
        return torch.empty(shape[0], padded, device=self.device)[:, :per_net].view(*shape)

    def _views(self, flat: torch.Tensor) -> Dict[str, torch.Tensor]:
        views = {}
        for name, (rows, cols) in self.shapes.items():
            start = self.offsets[name]
            views[name] = flat[:, start:start + rows * cols].view(self.K, rows, cols)
        return views

    def _from_net(self, state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        C, H = self.channels, self.hidden
        return {"conv": torch.cat([state["conv.weight"].reshape(C, -1), state["conv.bias"].reshape(C, 1)], 1),
                "hidden_w": state["hidden.weight"], "hidden_b": state["hidden.bias"].reshape(1, H),
                "output_w": state["output.weight"], "output_b": state["output.bias"].reshape(1, N_CLASSES)}

    def state_dict(self, k: int, momentum: bool = False) -> Dict[str, torch.Tensor]:
        """Net k's parameters (or, with ``momentum``, its momentum times the learning rate) under
        Net's names and shapes (copies)."""
        p = {name: view[k] for name, view in (self.velocity if momentum else self.params).items()}
        C, H, k_ = self.channels, self.hidden, self.kernel
        return {"conv.weight": p["conv"][:, :k_ * k_].reshape(C, 1, k_, k_).clone(),
                "conv.bias": p["conv"][:, k_ * k_].clone(), "hidden.weight": p["hidden_w"].clone(),
                "hidden.bias": p["hidden_b"].reshape(H).clone(), "output.weight": p["output_w"].clone(),
                "output.bias": p["output_b"].reshape(N_CLASSES).clone()}

    def keep(self, rows: Sequence[int]) -> None:
        """Drop every net but ``rows`` (in that order): stopped nets cost nothing afterwards."""
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.device)
        self._bind(self.store.index_select(0, index).contiguous())

    # ----- products: batched, or one net at a time -----
    def _addmm(self, out: torch.Tensor, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        """out = bias + a @ b, per net."""
        if self.batched:
            torch.baddbmm(bias, a, b, out=out)
        else:
            for k in range(self.K):
                torch.addmm(bias[k], a[k], b[k], out=out[k])

    def _mm(self, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        if self.batched:
            torch.bmm(a, b, out=out)
        else:
            for k in range(self.K):
                torch.mm(a[k], b[k], out=out[k])

    def _accumulate(self, velocity: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        """velocity = momentum * velocity + lr * (a @ b), per net, in one BLAS call."""
        m, lr = self.momentum, self.learning_rate
        if self.batched:
            velocity.baddbmm_(a, b, beta=m, alpha=lr)
        else:
            for k in range(self.K):
                velocity[k].addmm_(a[k], b[k], beta=m, alpha=lr)

    def _dense_backward(self, layer: str, grad_out: torch.Tensor, layer_in: torch.Tensor,
                        grad_in: torch.Tensor) -> None:
        """A dense layer's weight and bias gradients, folded into their momentum, and the gradient
        of its input written into ``grad_in``."""
        self._accumulate(self.velocity[f"{layer}_w"], grad_out.transpose(1, 2), layer_in)
        self._accumulate(self.velocity[f"{layer}_b"], self.ones_b, grad_out)
        self._mm(grad_in, grad_out, self.params[f"{layer}_w"])

    # ----- one step -----
    def _head(self, onehot: torch.Tensor, weight: torch.Tensor, label: torch.Tensor, picked_log_prob: torch.Tensor,
              predicted: torch.Tensor) -> None:
        """From the hidden layer's sum in ``output_in`` to the gradient reaching it in ``grad_output_in``:
        ReLU, output layer, loss, and the output layer's backward (folded into its momentum)."""
        p = self.params
        self.output_in.relu_()
        self._addmm(self.logits, p["output_b"], self.output_in, p["output_w"].transpose(1, 2))
        # loss: mean cross-entropy over each net's batch; its gradient (softmax - onehot) / n
        torch.log_softmax(self.logits, 2, out=self.log_probs)
        torch.gather(self.log_probs, 2, label, out=picked_log_prob)
        torch.argmax(self.logits, 2, out=predicted)
        torch.softmax(self.logits, 2, out=self.grad_logits)
        self.grad_logits.sub_(onehot).mul_(weight)
        self._dense_backward("output", self.grad_logits, self.output_in, self.grad_output_in)
        torch.ops.aten.threshold_backward.grad_input(self.grad_output_in, self.output_in, 0,
                                                     grad_input=self.grad_output_in)

    def step(self, x: torch.Tensor, rows: torch.Tensor, onehot: torch.Tensor, weight: torch.Tensor,
             label: torch.Tensor, picked_log_prob: torch.Tensor, predicted: torch.Tensor) -> None:
        """One SGD step of every net on its own batch.

        rows (K*B,) index ``x``; onehot (K, B, 10) the labels; weight (K, B, 1) 1/batch size,
        0 for padding; label (K, B, 1). Writes each sample's log-probability of its label into
        ``picked_log_prob`` (K, B, 1) and the predicted class into ``predicted`` (K, B).
        """
        p, v = self.params, self.velocity
        torch.index_select(x, 0, rows, out=self.images)
        self.patch_target.copy_(self.patch_source)
        self._mm(self.conv_out, p["conv"], self.patches)
        torch.clamp_min(self.conv_out_4d, 0, out=self.hidden_in_4d)
        self._addmm(self.output_in, p["hidden_b"], self.hidden_in, p["hidden_w"].transpose(1, 2))
        # output layer, loss and backward to the hidden layer; each gradient folded into its momentum
        self._head(onehot, weight, label, picked_log_prob, predicted)
        self._dense_backward("hidden", self.grad_output_in, self.hidden_in, self.grad_hidden_in)
        torch.ops.aten.threshold_backward.grad_input(self.grad_hidden_in_4d, self.conv_out_4d, 0,
                                                     grad_input=self.grad_conv_out_4d)
        self._accumulate(v["conv"], self.grad_conv_out, self.patches.transpose(1, 2))
        # update: p -= v for every parameter of every net
        self.flat_params.sub_(self.flat_velocity)
