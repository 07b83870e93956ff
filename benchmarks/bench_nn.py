"""mnist_nn's training speed against the reference's style, same model, data and batch size.

python -m benchmarks.bench_nn [--quick] [--no-run] [--repeats N]

Reference style: a torchvision-style Dataset that turns each uint8 image into a PIL image and
applies ToTensor + Normalize to it one sample at a time, wrapped in the reference's bootstrap
and fold index wrappers, read through ``DataLoader(batch_size=10)``, autograd and
``torch.optim.SGD``. (torchvision cannot be imported with a CPU build of torch, so its two
transforms are written out with the same torch operations.) Ours: the data set is one
normalised tensor on the device, batches are index gathers, and the step is written by hand
without autograd (``mnist_nn.train.fit_group``): one net alone (K=1, as a refit trains), and
the 5 folds of a candidate stacked (K=5, total samples/s of the 5 nets). For a net split into
blocks on a CPU, ours alone also runs with torch's products instead of ``mnist_nn.kernels``.

All train the same net from the same initial weights with SGD, for two epochs over (a prefix
of) each fold's training set (digits), with the same number of torch threads (one, and for the
big net also every core: ours then splits each step into blocks over the threads,
``mnist_nn.blocked``); samples/s is taken over the second epoch, best of ``--repeats`` rounds
(the rounds interleave the three, so a busy machine slows all of them alike). Beside each
speedup: its ceiling, the speedup a step that ran the net's arithmetic (``training_flops``) at the
device's big-square-product peak would reach: where the ceiling is under a target, no
implementation of the same arithmetic meets it. ``--device cuda``
(the default where CUDA is present) runs both sides on the GPU: the reference moves each batch
there, ours keeps the data set there. Prints a markdown table and writes ``bench-results/bench_nn.json``. It
also times whole runs (``RUNS``; ``--no-run`` skips them).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional
from unittest.mock import patch

import numpy as np
import torch

from common.data import load_dataset, resize_images
from mnist_nn.blocked import channel_blocks
from mnist_nn.kernels import SWITCH as kernel_switch
from mnist_nn.kernels import hidden_kernels, load
from mnist_nn.search import Candidate, draw_candidate
from mnist_nn.sampling import bootstrap_folds, fold_indexes
from mnist_nn.train import fit_group, keep_freed_memory, to_device

from .machine import cpu_model

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench-results"
#: whole runs timed, on this machine's CPU with the engine's defaults (1 worker, all cores) unless
#: said otherwise; on a GPU drop --subsample and --max-epochs
RUNS = [
    ["1", "1", "--dataset", "digits"],
    ["2", "2", "--dataset", "digits", "--seed", "25328", "--subsample", "300", "--max-epochs", "2", "--gpu", "cpu",
     "--workers", "2", "--threads", "1"],
]
GPU_RUNS = [["1", "1", "--dataset", "digits"], ["2", "2", "--dataset", "digits"]]


# ----- the reference's style -----
class PilDataset(torch.utils.data.Dataset):
    """Like torchvision.datasets.MNIST: a PIL image per sample, then the transform."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Any):
        self.images, self.labels, self.transform = images, labels, transform

    def __getitem__(self, index: int):
        from PIL import Image

        image = Image.fromarray(self.images[index], mode="L")
        return self.transform(image), int(self.labels[index])

    def __len__(self) -> int:
        return len(self.labels)


class ToTensorNormalize:
    """torchvision's ToTensor() then Normalize((mean,), (std,)), with the same torch operations."""

    def __init__(self, mean: float, std: float):
        self.mean, self.std = torch.tensor([mean]), torch.tensor([std])

    def __call__(self, picture: Any) -> torch.Tensor:
        tensor = torch.from_numpy(np.array(picture, np.uint8, copy=True))
        tensor = tensor.view(picture.size[1], picture.size[0], 1).permute((2, 0, 1)).contiguous()
        tensor = tensor.to(dtype=torch.get_default_dtype()).div(255)
        return tensor.sub_(self.mean[:, None, None]).div_(self.std[:, None, None])


class Subset(torch.utils.data.Dataset):
    """The reference's Bootstrap/Fold wrappers: one more index lookup per sample."""

    def __init__(self, data: torch.utils.data.Dataset, index: np.ndarray):
        self.data, self.index = data, index

    def __getitem__(self, i: int):
        return self.data[self.index[i]]

    def __len__(self) -> int:
        return len(self.index)


def reference_epochs(dataset: torch.utils.data.Dataset, candidate: Candidate, epochs: int,
                     device: str = "cpu") -> List[float]:
    """The reference's train_model loop (without its early stop), seconds per epoch."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=10)
    net = candidate.build().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=candidate.learning_rate, momentum=candidate.momentum)
    loss_function = torch.nn.CrossEntropyLoss()
    net.train(True)
    seconds = []
    for _ in range(epochs):
        start = time.perf_counter()
        loss_epoch = 0.0
        for inputs, labels in loader:
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = loss_function(net(inputs), labels)
            loss.backward()
            optimizer.step()
            loss_epoch += loss
        float(loss_epoch.detach())  # waits for the device, as the reference's print of the epoch loss does
        seconds.append(time.perf_counter() - start)
    return seconds


# ----- measuring -----
def ours_rate(data: Any, indexes: List[np.ndarray], candidate: Candidate, kernels: bool = True) -> float:
    """Total samples/s of the second epoch of ``fit_group`` over ``indexes`` (early stop lifted);
    ``kernels`` off: with torch's products (``MNIST_NN_CPU_KERNELS=0``)."""
    import mnist_nn.train as train

    saved, train.TOLERANCE = train.TOLERANCE, math.inf
    try:
        with patch.dict(os.environ, {} if kernels else {kernel_switch: "0"}):
            fits = fit_group(data.x_train, data.y_train, indexes, candidate, 2, 10, list(range(len(indexes))))
    finally:
        train.TOLERANCE = saved
    return sum(len(index) for index in indexes) / fits[0][1][-1]["seconds"]


def training_flops(candidate: Candidate) -> float:
    """Floating-point operations of one training sample: the forward's multiply-adds, and the
    backward's two products per dense layer (weights' and input's gradient) and one for the conv
    (its weights'; the image needs no gradient)."""
    conv_weights = candidate.n_conv_layer * (candidate.kernel_size ** 2 + 1)
    conv = conv_weights * candidate.conv_side ** 2  # multiply-adds: every conv weight at every position
    dense = candidate.n_weights - conv_weights  # multiply-adds: each dense weight once
    return 2.0 * (2 * conv + 3 * dense)


def peak_flops(device: str, size: int = 2048) -> float:
    """Float32 FLOP/s of a big square matrix product on ``device`` at the current thread count
    (best of 5): about the most any implementation of the training step could reach."""
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        (a @ b).sum().item()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size ** 3 / best


def measure(candidate: Candidate, label: str, samples: Optional[int], repeats: int, device: str,
            threads: int, dataset: Any, images: np.ndarray, data: Any, folds: List[np.ndarray],
            peaks: Dict[int, float]) -> Dict[str, Any]:
    """``dataset``, its training ``images`` resized to 28x28, ``data`` (the same on ``device``) and
    its ``folds`` are made once by the caller; ``peaks`` caches ``peak_flops`` per thread count."""
    torch.set_num_threads(threads)
    training = [fold_indexes(folds, f)[0][:samples] for f in range(5)]
    n = len(training[0])
    reference = Subset(PilDataset(images, dataset.y_train, ToTensorNormalize(data.mean, data.std)), training[0])
    rates: Dict[str, List[float]] = {"reference": [], "ours_k1": [], "ours_k5": []}
    # a net split into blocks on a CPU, where the kernels can be had: also with torch's products
    blocks = channel_blocks(candidate.n_conv_layer, candidate.conv_side ** 2, candidate.n_hidden_layer)
    blocked = device == "cpu" and len(blocks) > 1 and hidden_kernels() is not None
    if blocked:
        rates["ours_k1_torch_products"] = []
    for _ in range(repeats):
        torch.manual_seed(0)
        rates["reference"].append(n / reference_epochs(reference, candidate, epochs=2, device=device)[-1])
        rates["ours_k1"].append(ours_rate(data, training[:1], candidate))
        if blocked:
            rates["ours_k1_torch_products"].append(ours_rate(data, training[:1], candidate, kernels=False))
        rates["ours_k5"].append(ours_rate(data, training, candidate))
    best = {name: max(values) for name, values in rates.items()}
    peak = peaks[threads] = peaks.get(threads) or peak_flops(device)
    return {"model": label, **candidate.as_dict(), "weights": candidate.n_weights, "samples": n, "batch_size": 10,
            "device": device, "threads": threads, "flops_per_sample": training_flops(candidate), "peak_flops": peak,
            "ceiling_speedup": peak / (training_flops(candidate) * best["reference"]),
            "reference_samples_per_s": best["reference"], "ours_k1_samples_per_s": best["ours_k1"],
            "ours_k5_samples_per_s": best["ours_k5"], "speedup_k1": best["ours_k1"] / best["reference"],
            "ours_k1_torch_products_samples_per_s": best.get("ours_k1_torch_products"),
            "speedup_k5": best["ours_k5"] / best["reference"], "all_rounds": rates}


def time_whole_run(extra: List[str]) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "mnist_nn", *extra, "--no-progress", "--results", str(Path(folder) / "run")]
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - start
        summary = {}
        if proc.returncode == 0:
            summary = json.loads((Path(folder) / "run" / "summary.json").read_text())
    shown = " ".join(["python -m mnist_nn", *extra])
    return {"command": shown, "exit_code": proc.returncode, "wall_seconds": wall,
            "engine_wall_seconds": summary.get("wall_seconds"), "item_seconds_total": summary.get("item_seconds_total"),
            "ensemble_test_error": summary.get("ensemble_test_error"), "stderr_tail": proc.stderr[-500:]}


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the small model")
    parser.add_argument("--no-run", action="store_true", help="skip timing whole mnist_nn runs")
    parser.add_argument("--repeats", type=int, default=2, help="rounds per model; the best is kept")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where both sides train (default: cuda where present)")
    args = parser.parse_args(argv)
    keep_freed_memory()
    cores = len(os.sched_getaffinity(0))
    on_gpu = args.device == "cuda"
    big = None if on_gpu else 200  # samples per fold: the big net is slow on a CPU
    models = [(Candidate(8, 5, 64, 0.01, 0.5), "small (8 conv 5x5, 64 hidden)", None, 1)]
    if not args.quick:
        models.append((Candidate(2, 3, 16, 0.01, 0.5), "tiny (2 conv 3x3, 16 hidden)", None, 1))
        models.append((draw_candidate(0, 0, 0), "--seed 0's first candidate", big, 1))
        if cores > 1 and not on_gpu:
            models.append((draw_candidate(0, 0, 0), "--seed 0's first candidate", big, cores))
    dataset = load_dataset("digits")
    images, peaks = resize_images(dataset.x_train), {}
    data, folds = to_device(dataset, args.device), bootstrap_folds(len(dataset.y_train), 5, seed=0, bootstrap=0)
    rows = [measure(candidate, label, samples, args.repeats, args.device, threads, dataset, images, data, folds, peaks)
            for candidate, label, samples, threads in models]
    runs = [] if args.no_run else [time_whole_run(extra) for extra in (GPU_RUNS if on_gpu else RUNS)]
    device_name = torch.cuda.get_device_name() if on_gpu else f"{cpu_model()}, {cores} cores"
    kernels_line = "" if on_gpu else load()[1]
    report = {"benchmark": "mnist_nn", "host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
              "device": args.device, "device_name": device_name, "cpu_kernels": kernels_line,
              "load_average": os.getloadavg(), "fits": rows,
              "whole_runs": runs}
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_nn.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"device: {args.device} ({device_name}){'; ' + kernels_line if kernels_line else ''}\n")
    print("| model | weights | samples/fold | threads | reference samples/s | ours K=1 | speedup | ours K=5 (total) "
          "| speedup | ceiling | ours K=1, torch's products |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        torch_products = row["ours_k1_torch_products_samples_per_s"]
        print(f"| {row['model']} | {row['weights']:,} | {row['samples']} | {row['threads']} | "
              f"{row['reference_samples_per_s']:,.0f} | "
              f"{row['ours_k1_samples_per_s']:,.0f} | {row['speedup_k1']:.1f}x | {row['ours_k5_samples_per_s']:,.0f} | "
              f"{row['speedup_k5']:.1f}x | {row['ceiling_speedup']:.1f}x | "
              f"{'-' if torch_products is None else f'{torch_products:,.0f}'} |")
    print("\nceiling: the speedup a step running the net's arithmetic at the peak of a big square product on"
          " this device (same threads) would reach: peak FLOP/s / (FLOP per sample x reference samples/s)")
    for run in runs:
        print(f"\nwhole run `{run['command']}`: {run['wall_seconds']:.1f} s wall (exit {run['exit_code']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
