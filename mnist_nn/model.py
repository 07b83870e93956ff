"""The reference's network, and loading a saved one."""
from __future__ import annotations

from typing import Dict

import torch

from .shapes import IMAGE_SIZE, N_CLASSES


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


def net_holding(state: Dict[str, torch.Tensor], n_conv_layer: int, kernel_size: int, n_hidden_layer: int,
                image_size: int = IMAGE_SIZE) -> Net:
    """A Net whose parameters are ``state``'s tensors themselves (same device, no copy). Built on
    the meta device: no random initialisation to throw away, no second copy of the weights (5.8 GB
    for the biggest candidates)."""
    with torch.device("meta"):
        net = Net(n_conv_layer, kernel_size, n_hidden_layer, image_size)
    net.load_state_dict(state, assign=True)
    return net


def load_saved_model(pt_path) -> tuple:
    """(Net in eval mode, its parameters) from ``models/bootstrap-<i>.pt`` and the ``.json`` beside it.

    Feed it images as ``train.to_model_input(images, **params["normalisation"])`` does.
    """
    import json
    from pathlib import Path

    pt_path = Path(pt_path)
    params = json.loads(pt_path.with_suffix(".json").read_text())
    net = net_holding(torch.load(pt_path, weights_only=True), params["n_conv_layer"], params["kernel_size"],
                      params["n_hidden_layer"], params["image_size"])
    return net.eval(), params
