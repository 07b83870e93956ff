"""mnist_nn's training speed against the reference's style, same model, data and batch size.

python -m benchmarks.bench_nn [--quick] [--no-run] [--repeats N] [--device cpu|cuda] [--workers-per-gpu N]

Reference style: a torchvision-style Dataset that turns each uint8 image into a PIL image and
applies ToTensor + Normalize to it one sample at a time, wrapped in the reference's bootstrap and
fold index wrappers, read through ``DataLoader(batch_size=10)``, autograd and ``torch.optim.SGD``.
(torchvision's two transforms are written out with the same torch operations, so this runs where
torchvision is not installed.) Ours: ``mnist_nn.train.fit``, the same autograd and SGD, with the
data set as one normalised tensor on the device and batches gathered by index.

Both train the same net from the same initial weights for two epochs over (a prefix of) a fold's
training set (digits), with the same number of torch threads; samples/s is taken over the second
epoch, best of ``--repeats`` rounds (the rounds interleave the two, so a busy machine slows both
alike). Beside each speedup: its ceiling, the speedup a step that ran the net's arithmetic
(``training_flops``) at the device's big-square-product peak would reach. On CUDA (the default
where present) ours also runs as ``--workers-per-gpu`` processes sharing the GPU (total samples/s).
Prints a markdown table and writes ``bench-results/bench_nn.json``; it also times whole runs
(``RUNS``; ``--no-run`` skips them).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from common.data import load_dataset, resize_images
from common.results.layout import ResultsLayout
from mnist_nn.sampling import bootstrap_folds, fold_indexes
from mnist_nn.search import Candidate, draw_candidate
from mnist_nn.train import fit, keep_freed_memory, to_device, use_fixed_cublas_workspace

from .machine import cpu_model

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench-results"
#: whole runs timed on a CPU, with the engine's defaults (1 worker, all cores) unless said otherwise. The
#: nets are those a CPU trains in minutes (--max-macs 1e6): the default seed's own first candidate has
#: 274M weights (950 conv 7x7, 596 hidden) and trains at 10 samples/s on 2 cores, hours for a run
RUNS = [
    ["1", "1", "--dataset", "digits", "--max-macs", "1e6"],
    ["2", "2", "--dataset", "digits", "--max-macs", "1e6", "--gpu", "cpu", "--workers", "2", "--threads", "1"],
]
GPU_RUNS = [["1", "1", "--dataset", "digits"], ["2", "2", "--dataset", "digits"]]
#: a whole run still going after this long is killed and reported as such, so that make bench ends
RUN_CAP_SECONDS = 1800.0
#: the models measured: tiny, small, and the default seed's first candidate
MODELS = [(Candidate(2, 3, 16, 0.01, 0.5), "tiny (2 conv 3x3, 16 hidden)"),
          (Candidate(8, 5, 64, 0.01, 0.5), "small (8 conv 5x5, 64 hidden)")]


def default_seed() -> int:
    """mnist_nn's own default ``--seed``."""
    from common.run.cli import build_parser
    from mnist_nn.app import MnistNN

    return build_parser(MnistNN, quiet=True).parse_args(["1", "1"]).seed


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
    torch.manual_seed(0)
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


# ----- ours -----
def ours_seconds(data: Any, index: np.ndarray, candidate: Candidate, epochs: int = 2) -> List[float]:
    """Seconds of each epoch of ``mnist_nn.train.fit`` (its early stop lifted), under the settings a
    run's workers fit under (deterministic, full float32); torch's defaults back for the reference."""
    import mnist_nn.train as train

    saved, train.TOLERANCE = train.TOLERANCE, math.inf
    restore = train.make_reproducible()
    try:
        _, log = fit(data.x_train, data.y_train, index, candidate, epochs, 10, init_seed=0)
    finally:
        train.TOLERANCE = saved
        restore()
    return [entry["seconds"] for entry in log]


def _shared_gpu_worker(candidate: Candidate, samples: Optional[int], epochs: int, barrier: Any, queue: Any) -> None:
    """One of ``--workers-per-gpu`` processes: its own copy of the data on the GPU, a warm-up fit,
    then, when all are ready, ``epochs`` epochs; reports (start, end, samples trained)."""
    data, index = _fold_data("cuda", samples)
    ours_seconds(data, index[:50], candidate, epochs=1)  # CUDA context, cuDNN and cuBLAS start-up
    torch.cuda.synchronize()
    barrier.wait()
    start = time.time()
    ours_seconds(data, index, candidate, epochs)
    queue.put((start, time.time(), len(index) * epochs))


def shared_gpu_rate(candidate: Candidate, samples: Optional[int], workers: int, epochs: int = 3) -> float:
    """Total samples/s of ``workers`` processes training ``candidate`` at once on one GPU."""
    context = multiprocessing.get_context("spawn")
    barrier, queue = context.Barrier(workers), context.Queue()
    processes = [context.Process(target=_shared_gpu_worker, args=(candidate, samples, epochs, barrier, queue))
                 for _ in range(workers)]
    for process in processes:
        process.start()
    spans = [queue.get() for _ in processes]
    for process in processes:
        process.join()
    return sum(n for _, _, n in spans) / (max(end for _, end, _ in spans) - min(start for start, _, _ in spans))


def _fold_data(device: str, samples: Optional[int]):
    """The digits on ``device`` (one tensor) and the first fold's training rows of the default seed's
    first bootstrap (their first ``samples``)."""
    dataset = load_dataset("digits")
    folds = bootstrap_folds(len(dataset.y_train), 5, seed=default_seed(), bootstrap=0)
    return to_device(dataset, device), fold_indexes(folds, 0)[0][:samples]


# ----- measuring -----
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


def measure(candidate: Candidate, label: str, samples: Optional[int], repeats: int, device: str, threads: int,
            workers_per_gpu: int, peaks: Dict[int, float]) -> Dict[str, Any]:
    """One model: the reference's style and ours, ``repeats`` interleaved rounds, the best of each."""
    torch.set_num_threads(threads)
    data, index = _fold_data(device, samples)
    dataset = load_dataset("digits")
    reference = Subset(PilDataset(resize_images(dataset.x_train), dataset.y_train,
                                  ToTensorNormalize(data.mean, data.std)), index)
    n = len(index)
    rates: Dict[str, List[float]] = {"reference": [], "ours": []}
    for _ in range(repeats):
        rates["reference"].append(n / reference_epochs(reference, candidate, epochs=2, device=device)[-1])
        rates["ours"].append(n / ours_seconds(data, index, candidate)[-1])
    best = {name: max(values) for name, values in rates.items()}
    peak = peaks[threads] = peaks.get(threads) or peak_flops(device)
    row = {"model": label, **candidate.as_dict(), "weights": candidate.n_weights, "samples": n, "batch_size": 10,
           "device": device, "threads": threads, "flops_per_sample": training_flops(candidate), "peak_flops": peak,
           "ceiling_speedup": peak / (training_flops(candidate) * best["reference"]),
           "reference_samples_per_s": best["reference"], "ours_samples_per_s": best["ours"],
           "speedup": best["ours"] / best["reference"], "all_rounds": rates}
    if device == "cuda" and workers_per_gpu > 1:
        shared = shared_gpu_rate(candidate, samples, workers_per_gpu)
        row.update(workers_per_gpu=workers_per_gpu, ours_shared_samples_per_s=shared,
                   speedup_shared=shared / best["reference"])
    return row


def time_whole_run(extra: List[str], cap: float = RUN_CAP_SECONDS) -> Dict[str, Any]:
    """One whole mnist_nn run, timed; past ``cap`` seconds its whole process group is killed (no run
    of it is left behind) and the row says so, so that ``make bench`` always ends."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "mnist_nn", *extra, "--no-progress", "--results", str(Path(folder) / "run")]
        start = time.perf_counter()
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=cap)
            capped = False
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # it may have ended just now
                os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate()
            capped = True
        wall = time.perf_counter() - start
        summary = {}
        if proc.returncode == 0:
            summary = json.loads(ResultsLayout(Path(folder) / "run").summary_json.read_text())
    shown = " ".join(["python -m mnist_nn", *extra])
    return {"command": shown, "exit_code": proc.returncode, "wall_seconds": wall, "capped": capped,
            "engine_wall_seconds": summary.get("wall_seconds"), "item_seconds_total": summary.get("item_seconds_total"),
            "ensemble_test_error": summary.get("ensemble_test_error"), "stderr_tail": stderr[-500:]}


def print_table(rows: List[Dict[str, Any]]) -> None:
    shared = any("workers_per_gpu" in row for row in rows)
    extra = " ours, N workers per GPU (total) | speedup |" if shared else ""
    print(f"| model | weights | samples | threads | reference samples/s | ours samples/s | speedup | ceiling |{extra}")
    print("|---" * (10 if shared else 8) + "|")
    for row in rows:
        cells = (f" {row['ours_shared_samples_per_s']:,.0f} (N={row['workers_per_gpu']}) | {row['speedup_shared']:.1f}x |"
                 if "workers_per_gpu" in row else "")
        print(f"| {row['model']} | {row['weights']:,} | {row['samples']} | {row['threads']} | "
              f"{row['reference_samples_per_s']:,.0f} | {row['ours_samples_per_s']:,.0f} | {row['speedup']:.1f}x | "
              f"{row['ceiling_speedup']:.1f}x |{cells}")
    print("\nceiling: the speedup a step running the net's arithmetic at the peak of a big square product on"
          " this device (same threads) would reach: peak FLOP/s / (FLOP per sample x reference samples/s)")


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the small model")
    parser.add_argument("--no-run", action="store_true", help="skip timing whole mnist_nn runs")
    parser.add_argument("--repeats", type=int, default=2, help="rounds per model; the best is kept")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where both sides train (default: cuda where present)")
    parser.add_argument("--workers-per-gpu", type=int, default=4, help="on CUDA, also ours as N processes on the GPU")
    parser.add_argument("--out", type=Path, default=OUT / "bench_nn.json", help="the JSON report")
    args = parser.parse_args(argv)
    keep_freed_memory()
    use_fixed_cublas_workspace()  # before any GPU work: ours needs it, and both sides then share it
    cores = len(os.sched_getaffinity(0))
    on_gpu = args.device == "cuda"
    big = None if on_gpu else 200  # samples: the default seed's first net is slow on a CPU
    first = draw_candidate(default_seed(), 0, 0)
    models = [(candidate, label, None, 1) for candidate, label in MODELS[1 if args.quick else 0:]]
    if not args.quick:
        models.append((first, f"default seed's first candidate ({first.describe()})", big, 1))
        if cores > 1 and not on_gpu:
            models.append((first, f"default seed's first candidate ({first.describe()})", big, cores))
    peaks: Dict[int, float] = {}
    rows = [measure(candidate, label, samples, args.repeats, args.device, threads, args.workers_per_gpu, peaks)
            for candidate, label, samples, threads in models]
    runs = [] if args.no_run else [time_whole_run(extra) for extra in (GPU_RUNS if on_gpu else RUNS)]
    device_name = torch.cuda.get_device_name() if on_gpu else f"{cpu_model()}, {cores} cores"
    report = {"benchmark": "mnist_nn", "host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
              "device": args.device, "device_name": device_name, "load_average": os.getloadavg(), "fits": rows,
              "whole_runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"device: {args.device} ({device_name}), torch {torch.__version__}\n")
    print_table(rows)
    for run in runs:
        ended = (f"killed unfinished after {run['wall_seconds']:.0f} s (cap {RUN_CAP_SECONDS:.0f} s)" if run["capped"]
                 else f"{run['wall_seconds']:.1f} s wall (exit {run['exit_code']})")
        print(f"\nwhole run `{run['command']}`: {ended}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
