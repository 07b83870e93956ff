"""The figures: each model's test error against the ensemble's, the certainty box plots, training curves."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

import numpy as np
from matplotlib.ticker import MaxNLocator

from common.outputs import new_figure, save_figure

#: how many test images get a certainty figure
N_CERTAINTY = 4


def plot_ensemble_errors(model_errors: Sequence[float], bootstraps: Sequence[int], ensemble: Mapping[str, float],
                         path: Path) -> None:
    """One bar per model, and the ensemble's two test errors as lines across them."""
    fig, ax = new_figure(max(4.0, 0.5 * len(model_errors) + 2.5), 3.5)
    ax.bar(range(len(model_errors)), np.asarray(model_errors) * 100, color="#9bb7d4", label="single model")
    ax.axhline(ensemble["majority_vote"] * 100, color="#c0392b", label="ensemble: majority vote")
    ax.axhline(ensemble["mean_probability"] * 100, color="#27ae60", linestyle="--", label="ensemble: mean probability")
    top = max(list(model_errors) + list(ensemble.values()))
    ax.set_ylim(0, max(top * 100 * 1.45, 1e-3))
    ax.set_xticks(range(len(model_errors)), [str(b) for b in bootstraps])
    ax.set_xlabel("bootstrap model")
    ax.set_ylabel("test error (%)")
    ax.set_title("Test error: each model and the ensemble")
    ax.legend(fontsize="small", loc="upper right")
    save_figure(fig, path)


def chosen_images(probabilities: np.ndarray, labels: np.ndarray, count: int = N_CERTAINTY) -> List[int]:
    """The first test images, the one the ensemble is least sure of, and the first it gets wrong."""
    mean = probabilities.mean(0)
    wrong = np.flatnonzero(mean.argmax(1) != labels)
    picks = [0, 1, int(mean.max(1).argmin())] + ([int(wrong[0])] if len(wrong) else [])
    picks += list(range(2, len(labels)))[: count]
    unique: List[int] = []
    for index in picks:
        if index < len(labels) and index not in unique:
            unique.append(index)
    return unique[:count]


def plot_certainty(probabilities: np.ndarray, images: np.ndarray, labels: np.ndarray, folder: Path) -> List[str]:
    """The reference's certainty figure: per digit, a box plot over models of its probability."""
    names = []
    for index in chosen_images(probabilities, labels):
        fig, (left, right) = new_figure(8, 3.2, 1, 2, gridspec_kw={"width_ratios": [1, 2.6], "wspace": 0.3})
        left.imshow(images[index], cmap="gray")
        left.set_axis_off()
        left.set_title(f"test image {index}\nlabel {labels[index]}")
        right.boxplot(probabilities[:, index, :], positions=range(probabilities.shape[2]))
        right.set_ylim(-0.05, 1.05)
        right.set_xlabel("digit")
        right.set_ylabel("predicted probability")
        right.set_title(f"over {probabilities.shape[0]} model(s)")
        name = f"certainty-{index}"
        save_figure(fig, folder / name)
        names.append(name)
    return names


def plot_training_curves(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Training loss per epoch: every CV fit in grey, each refit in colour."""
    fig, ax = new_figure(5.5, 3.5)
    curves: Dict[str, List[Mapping[str, Any]]] = {}
    for row in rows:
        curves.setdefault(row["item"], []).append(row)
    for key, points in curves.items():
        refit = points[0]["fold"] == "refit"
        ax.plot([p["epoch"] for p in points], [p["loss"] for p in points], marker="o" if refit else None,
                color=None if refit else "0.75", linewidth=1.5 if refit else 0.8, label=key if refit else None,
                zorder=2 if refit else 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.set_title("Training loss (grey: CV fits)")
    if any(points[0]["fold"] == "refit" for points in curves.values()):
        ax.legend(fontsize="small")
    save_figure(fig, path)
