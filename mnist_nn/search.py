"""The reference's random search: one point (``Candidate``) and its distribution (``draw_candidate``).

Needs no torch: rank 0 builds the work items from it without importing torch.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional

import numpy as np

from common import item_seed

from .shapes import IMAGE_SIZE, N_CLASSES

if TYPE_CHECKING:
    from .model import Net

#: bytes per weight to train a net: the weights, their gradient and SGD's momentum (float32)
TRAIN_BYTES_PER_WEIGHT = 12


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

    def describe(self) -> str:
        return f"{self.n_conv_layer} conv {self.kernel_size}x{self.kernel_size}, {self.n_hidden_layer} hidden"

    def build(self) -> Net:
        from .model import Net  # imports torch: only workers build nets

        return Net(self.n_conv_layer, self.kernel_size, self.n_hidden_layer)

    @property
    def conv_side(self) -> int:
        """Side of each conv channel's output on a 28x28 image (no padding)."""
        return IMAGE_SIZE - self.kernel_size + 1

    @property
    def n_weights(self) -> int:
        """Number of trainable numbers; the hidden layer dominates for big candidates."""
        features = self.n_conv_layer * self.conv_side ** 2
        return (self.n_conv_layer * (self.kernel_size ** 2 + 1) + (features + 1) * self.n_hidden_layer
                + (self.n_hidden_layer + 1) * N_CLASSES)

    @property
    def cost(self) -> float:
        """Multiply-adds of one image's forward pass (at least ``n_weights``): the slowest fits are
        handed out first, and ``--max-macs`` bounds it."""
        conv = self.n_conv_layer * self.conv_side ** 2 * self.kernel_size ** 2
        return float(conv + self.n_weights)


def draw_candidate(seed: int, bootstrap: int, candidate: int, max_macs: Optional[float] = None) -> Candidate:
    """The reference's distribution, drawn from ``--seed`` and the candidate's identity only.

    n_conv_layer ~ U{1..999}, kernel_size ~ U{2..10}, n_hidden_layer ~ U{1..1999},
    learning rate 10^U(-5,-1), momentum 10^U(-2,0). With ``max_macs`` (``--max-macs``, not the
    reference's search), draws again from the same stream until a net's ``cost`` is at most that:
    the reference's distribution restricted to small nets.
    """
    rng = np.random.default_rng(item_seed(seed, f"bootstrap={bootstrap},candidate={candidate}"))
    return draw_from(rng, max_macs)


def draw_from(rng: np.random.Generator, max_macs: Optional[float] = None) -> Candidate:
    """One candidate from ``rng`` in the reference's order (``random_parameter``): conv channels,
    kernel size, hidden units, learning rate, momentum. With ``max_macs``, draws again until small."""
    while True:
        drawn = Candidate(
            n_conv_layer=int(rng.integers(1, 1000)),
            kernel_size=int(rng.integers(2, 11)),
            n_hidden_layer=int(rng.integers(1, 2000)),
            learning_rate=float(math.pow(10.0, rng.random() * 4.0 - 5.0)),
            momentum=float(math.pow(10.0, rng.random() * 2.0 - 2.0)),
        )
        if max_macs is None or drawn.cost <= max_macs:
            return drawn


def reference_candidates(seed: int, bootstrap: int, n_train: int, folds: int, n_tuning: int,
                         max_macs: Optional[float] = None) -> list:
    """The reference's candidates of one bootstrap: drawn in order from its generator after the
    bootstrap's own draws (so they depend on the training-set size, as in the reference)."""
    from .sampling import reference_bootstrap

    _, rng = reference_bootstrap(n_train, folds, seed, bootstrap)
    return [draw_from(rng, max_macs) for _ in range(n_tuning)]
