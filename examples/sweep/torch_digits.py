"""A small PyTorch net on scikit-learn's digits: learning rate x hidden units, 3 repeats each (its
own seed: initial weights and batch order), on the GPU each worker is pinned to (``device``).

    mpiexec -n 2 python examples/sweep/torch_digits.py --gpu all --results results/torch_digits
    python examples/sweep/torch_digits.py --gpu cpu --workers 2      # no GPU
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, where it is not installed

from common import sweep  # noqa: E402

GRID = {"learning_rate": [0.003, 0.03, 0.3], "hidden": [16, 64]}


def fit(params, seed, device):
    import torch
    from sklearn.datasets import load_digits

    torch.manual_seed(seed)
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images / 16.0, dtype=torch.float32, device=device)
    y = torch.tensor(labels, device=device)
    train, test = torch.arange(0, 1400, device=device), torch.arange(1400, len(y), device=device)
    net = torch.nn.Sequential(torch.nn.Linear(64, params["hidden"]), torch.nn.ReLU(),
                              torch.nn.Linear(params["hidden"], 10)).to(device)
    optimiser = torch.optim.SGD(net.parameters(), lr=params["learning_rate"], momentum=0.9)
    for _ in range(10):  # epochs
        for batch in train[torch.randperm(len(train), device=device)].split(32):
            optimiser.zero_grad()
            torch.nn.functional.cross_entropy(net(x[batch]), y[batch]).backward()
            optimiser.step()
    with torch.no_grad():
        error = (net(x[test]).argmax(1) != y[test]).double().mean().item()  # float64, as numpy's mean
    return {"error": error}


if __name__ == "__main__":
    raise SystemExit(sweep.main(fit, grid=GRID, repeats=3, minimise="error"))
