"""The reference's network and its random-search distribution of hyperparameters."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict

import numpy as np
import torch

from common.items import item_seed

IMAGE_SIZE = 28
N_CLASSES = 10


class Net(torch.nn.Module):
    """Conv2d(1, n_conv_layer, kernel_size) -> flatten -> ReLU -> Linear(n_hidden_layer) -> ReLU -> Linear(10)."""

    def __init__(self, n_conv_layer: int, kernel_size: int, n_hidden_layer: int, image_size: int = IMAGE_SIZE):
        super().__init__()
        side = image_size - kernel_size + 1
        self.conv = torch.nn.Conv2d(1, n_conv_layer, kernel_size)
        self.hidden = torch.nn.Linear(n_conv_layer * side * side, n_hidden_layer)
        self.output = torch.nn.Linear(n_hidden_layer, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(torch.flatten(self.conv(x), 1))
        x = torch.relu(self.hidden(x))
        return self.output(x)


@dataclass(frozen=True)
class Candidate:
    """One point of the random search: the architecture and the SGD settings."""

    n_conv_layer: int
    kernel_size: int
    n_hidden_layer: int
    learning_rate: float
    momentum: float

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def build(self) -> Net:
        return Net(self.n_conv_layer, self.kernel_size, self.n_hidden_layer)

    @property
    def n_weights(self) -> int:
        """Number of trainable numbers; the hidden layer dominates for big candidates."""
        side = IMAGE_SIZE - self.kernel_size + 1
        features = self.n_conv_layer * side * side
        return (self.n_conv_layer * (self.kernel_size ** 2 + 1) + (features + 1) * self.n_hidden_layer
                + (self.n_hidden_layer + 1) * N_CLASSES)

    @property
    def cost(self) -> float:
        """Multiply-adds per training sample (forward), to hand out the slowest fits first."""
        side = IMAGE_SIZE - self.kernel_size + 1
        conv = self.n_conv_layer * side * side * self.kernel_size ** 2
        return float(conv + self.n_weights)


def draw_candidate(seed: int, bootstrap: int, candidate: int) -> Candidate:
    """The reference's distribution, drawn from ``--seed`` and the candidate's identity only.

    n_conv_layer ~ U{1..999}, kernel_size ~ U{2..10}, n_hidden_layer ~ U{1..1999},
    learning rate 10^U(-5,-1), momentum 10^U(-2,0).
    """
    rng = np.random.default_rng(item_seed(seed, f"bootstrap={bootstrap},candidate={candidate}"))
    return Candidate(
        n_conv_layer=int(rng.integers(1, 1000)),
        kernel_size=int(rng.integers(2, 11)),
        n_hidden_layer=int(rng.integers(1, 2000)),
        learning_rate=float(math.pow(10.0, rng.random() * 4.0 - 5.0)),
        momentum=float(math.pow(10.0, rng.random() * 2.0 - 2.0)),
    )


def load_saved_model(pt_path) -> tuple:
    """(Net in eval mode, its parameters) from ``models/bootstrap-<i>.pt`` and the ``.json`` beside it.

    Feed it images as ``train.to_model_input(images, **params["normalisation"])`` does.
    """
    import json
    from pathlib import Path

    pt_path = Path(pt_path)
    params = json.loads(pt_path.with_suffix(".json").read_text())
    net = Net(params["n_conv_layer"], params["kernel_size"], params["n_hidden_layer"], params["image_size"])
    net.load_state_dict(torch.load(pt_path, weights_only=True))
    return net.eval(), params
