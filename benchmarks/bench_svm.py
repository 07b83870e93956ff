"""Seconds per grid item of mnist_svm: the reference's data path against ours, in one run.

    python -m benchmarks.bench_svm [--subsample 10000] [--repeats 1] [--points 3] [--cpu-only]

On a 10,000-image stratified subsample of Fashion-MNIST (Debian's dataset-fashion-mnist, or
--data-dir), one grid item = fit on 4 folds (8,000 images) + predict the 5th (2,000):
- reference: images read one at a time in a Python loop into float64 arrays, standardised in
  float64, and the reference's model: one-vs-rest RBF SVCs (its cuML ``multiclass_strategy="ovr"``;
  here scikit-learn's ``OneVsRestClassifier`` of default ``SVC``s, cache_size=200 MB);
- ours: the whole IDX array read at once, standardised in float64 (as libsvm computes), mnist_svm's CPU backend (the
  RBF kernel computed with BLAS in float64 and handed to libsvm precomputed, cache raised to 1 GB).
Both run on one core (BLAS limited to one thread), and must predict exactly the same labels. Where cuML is installed (a GPU node), the full-size
grid item (48,000 training images) is also timed on cuML against scikit-learn, as fits per hour.
Prints a markdown table and writes bench-results/bench_svm.json.
"""
from __future__ import annotations

import argparse
import gzip
import json
import platform
import struct
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from common.data import Dataset, find_idx_files, load_dataset, stratified_subsample
from mnist_svm.backends import PIXEL_CENTRE, PIXEL_SCALE, CumlBackend, SklearnBackend, have_cuml

#: points of the reference's n_tuning=24 grid: two near Fashion-MNIST's best, and the slow small-C corner
POINTS: List[Tuple[float, float]] = [(10 ** 1.3043, 10 ** -2.6957), (10 ** 2.4783, 10 ** -3.3913), (1e-3, 1e-6)]
REQUIRED_SPEEDUP = 1.5


# ----- the reference's data path -----
def reference_read_images(path: Path) -> np.ndarray:
    """As a naive reference did: one image at a time, each a float64 row, stacked at the end."""
    with gzip.open(path, "rb") as handle:
        _, count, rows, cols = struct.unpack(">IIII", handle.read(16))
        images = []
        for _ in range(count):
            images.append(np.array(list(handle.read(rows * cols)), dtype=np.float64))
    return np.array(images)


def reference_read_labels(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as handle:
        _, count = struct.unpack(">II", handle.read(8))
        return np.array([handle.read(1)[0] for _ in range(count)], dtype=np.int64)


def reference_load(files: Dict[str, Path]) -> Tuple[np.ndarray, np.ndarray]:
    x = (reference_read_images(files["x_train"]) - PIXEL_CENTRE) / PIXEL_SCALE
    return x, reference_read_labels(files["y_train"])


def reference_item(x: np.ndarray, y: np.ndarray, train: np.ndarray, validation: np.ndarray,
                   c: float, gamma: float) -> np.ndarray:
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.svm import SVC

    from mnist_svm.backends import last_argmax

    # one-vs-rest, as the reference fits (mnist_svm's default since it gives the reference's
    # statistics): SVC alone is one-vs-one, a different model whose predictions differ. Its ties
    # go to the later class, as under the reference's scikit-learn 1.3.1 (this one's predict gives
    # them to the earlier class)
    model = OneVsRestClassifier(SVC(C=c, gamma=gamma, kernel="rbf")).fit(x[train], y[train])
    return model.classes_[last_argmax(model.decision_function(x[validation]))]


def our_item(backend, train: np.ndarray, validation: np.ndarray, c: float, gamma: float) -> np.ndarray:
    return backend.predict(backend.fit(c, gamma, train), "train", validation)


def timed(function, *args):
    start = time.perf_counter()
    value = function(*args)
    return value, time.perf_counter() - start


# ----- the benchmark -----
def cpu_comparison(data_dir: Path, subsample: int, repeats: int, points: int) -> Dict:
    from sklearn.model_selection import StratifiedKFold
    from threadpoolctl import threadpool_limits

    files = find_idx_files("fashion-mnist", data_dir)
    if files is None:
        raise SystemExit("bench_svm: Fashion-MNIST not found: apt-get install dataset-fashion-mnist, or --data-dir")
    (x_ref_all, y_ref_all), ref_load = timed(reference_load, files)
    full, our_load = timed(load_dataset, "fashion-mnist", data_dir)
    assert np.array_equal(y_ref_all, full.y_train), "the two readers disagree on the labels"
    keep = stratified_subsample(full.y_train, subsample, seed=0)
    x_ref, y_ref = x_ref_all[keep], y_ref_all[keep]
    ours = SklearnBackend(Dataset("fashion-mnist", full.x_train[keep], full.y_train[keep], full.x_test, full.y_test))
    train, validation = next(StratifiedKFold(5, shuffle=True, random_state=0).split(x_ref, y_ref))
    rows = []
    for c, gamma in POINTS[:points]:
        ref_times, our_times = [], []
        for _ in range(repeats):
            with threadpool_limits(1):  # one core each: libsvm itself is single-threaded
                ref_pred, seconds = timed(reference_item, x_ref, y_ref, train, validation, c, gamma)
                ref_times.append(seconds)
                our_pred, seconds = timed(our_item, ours, train, validation, c, gamma)
                our_times.append(seconds)
        agreement = float(np.mean(ref_pred == our_pred))
        rows.append({"C": c, "gamma": gamma, "reference_s": min(ref_times), "ours_s": min(our_times),
                     "speedup": min(ref_times) / min(our_times), "prediction_agreement": agreement,
                     "validation_error": float(np.mean(our_pred != y_ref[validation]))})
        print(f"  C={c:.3g} gamma={gamma:.3g}: reference {min(ref_times):.2f} s, ours {min(our_times):.2f} s, "
              f"agreement {agreement:.4%}", file=sys.stderr, flush=True)
    return {"train_rows": int(len(train)), "validation_rows": int(len(validation)), "points": rows,
            "load_60k_reference_s": ref_load, "load_60k_ours_s": our_load,
            "per_fit_reference_s": float(np.mean([r["reference_s"] for r in rows])),
            "per_fit_ours_s": float(np.mean([r["ours_s"] for r in rows])),
            "speedup_total": float(sum(r["reference_s"] for r in rows) / sum(r["ours_s"] for r in rows))}


def gpu_comparison(data_dir: Path) -> Dict:
    """Full-size grid item (48,000 / 12,000) on cuML, and one on scikit-learn for scale."""
    from sklearn.model_selection import StratifiedKFold

    data = load_dataset("fashion-mnist", data_dir)
    train, validation = next(StratifiedKFold(5, shuffle=True, random_state=0).split(data.y_train, data.y_train))
    c, gamma = POINTS[0]
    gpu = CumlBackend(data)
    our_item(gpu, train[:1000], validation[:100], c, gamma)  # warm-up: CUDA context, kernels
    gpu_pred, gpu_s = timed(our_item, gpu, train, validation, c, gamma)
    cpu_pred, cpu_s = timed(our_item, SklearnBackend(data), train, validation, c, gamma)
    return {"train_rows": int(len(train)), "cuml_s": gpu_s, "sklearn_s": cpu_s,
            "cuml_fits_per_hour": 3600 / gpu_s, "sklearn_fits_per_hour": 3600 / cpu_s,
            "prediction_agreement": float(np.mean(gpu_pred == cpu_pred))}


def markdown(report: Dict) -> str:
    cpu = report["cpu"]
    lines = [f"### mnist_svm: seconds per grid item, Fashion-MNIST {cpu['train_rows']} + {cpu['validation_rows']} "
             f"images, 1 core", "",
             "| C | gamma | reference (s) | ours (s) | speedup | same predictions |", "|---|---|---|---|---|---|"]
    lines += [f"| {p['C']:.3g} | {p['gamma']:.3g} | {p['reference_s']:.2f} | {p['ours_s']:.2f} | "
              f"{p['speedup']:.2f}x | {p['prediction_agreement']:.2%} |" for p in cpu["points"]]
    lines += [f"| all | | {sum(p['reference_s'] for p in cpu['points']):.2f} | "
              f"{sum(p['ours_s'] for p in cpu['points']):.2f} | {cpu['speedup_total']:.2f}x | |"]
    lines += ["", f"Reading the 60,000 training images: reference loop {cpu['load_60k_reference_s']:.1f} s, "
                  f"whole-array read {cpu['load_60k_ours_s']:.2f} s."]
    if report.get("gpu"):
        g = report["gpu"]
        lines += ["", f"Full-size grid item ({g['train_rows']} training images): cuML {g['cuml_s']:.2f} s "
                      f"({g['cuml_fits_per_hour']:.0f} fits/hour), scikit-learn {g['sklearn_s']:.1f} s "
                      f"({g['sklearn_fits_per_hour']:.0f} fits/hour), agreement {g['prediction_agreement']:.2%}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_svm", description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--subsample", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=1, help="fits per path and point (the fastest counts)")
    parser.add_argument("--points", type=int, default=len(POINTS), choices=range(1, len(POINTS) + 1),
                        help="how many of the (C, gamma) points to time")
    parser.add_argument("--cpu-only", action="store_true", help="skip the cuML comparison even where cuML is installed")
    parser.add_argument("--out", type=Path, default=Path("bench-results") / "bench_svm.json")
    args = parser.parse_args(argv)
    report = {"benchmark": "bench_svm", "host": platform.node(), "python": platform.python_version(),
              "cpu": cpu_comparison(args.data_dir, args.subsample, args.repeats, args.points)}
    if have_cuml() and not args.cpu_only:
        report["gpu"] = gpu_comparison(args.data_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))
    cpu = report["cpu"]
    slow = [p for p in cpu["points"] if p["speedup"] < REQUIRED_SPEEDUP]
    differ = [p for p in cpu["points"] if p["prediction_agreement"] < 1.0]
    if slow or differ:
        print(f"bench_svm: FAILED: {len(slow)} point(s) under {REQUIRED_SPEEDUP}x, {len(differ)} with other "
              f"predictions", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
