"""The figures: each model's test error against the ensemble's, the certainty box plots, training curves."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

import numpy as np
from matplotlib.ticker import MaxNLocator

from common import FIGURE_SET_FORMATS, counted, new_figure, save_figure
from common.results.layout import CERTAINTY_FOLDER, MISCLASSIFIED_NAME, TEST_IMAGE_NAME

#: names written in that folder (what an earlier run left there that this one did not write is removed)
CERTAINTY_FILE = re.compile("(" + "|".join(re.escape(name).replace(re.escape("{}"), "[0-9]+")
                                            for name in (TEST_IMAGE_NAME, MISCLASSIFIED_NAME)) + r")\.(png|pdf|svg)")


def plot_ensemble_errors(model_errors: Sequence[float], bootstraps: Sequence[int], ensemble: Mapping[str, float],
                         path: Path) -> Any:
    """One bar per model, and the ensemble's two test errors as lines across them; returns the figure.

    The axis ends at 100%: errors high enough to leave the legend no room above them (nets that did
    not learn, 90% on ten digits) put it under the axes instead of stretching the axis past 100%."""
    fig, ax = new_figure(max(4.0, 0.5 * len(model_errors) + 2.5), 3.5)
    ax.bar(range(len(model_errors)), np.asarray(model_errors) * 100, color="#9bb7d4", label="single model")
    ax.axhline(ensemble["majority_vote"] * 100, color="#c0392b", label="ensemble: majority vote")
    ax.axhline(ensemble["mean_probability"] * 100, color="#27ae60", linestyle="--", label="ensemble: mean probability")
    top = max(list(model_errors) + list(ensemble.values())) * 100
    room = top * 1.45  # headroom above the highest bar or line for the legend
    ax.set_ylim(0, max(min(room, 100.0), top, 1e-3))
    ax.set_xticks(range(len(model_errors)), [str(b) for b in bootstraps])
    ax.set_xlabel("bootstrap model")
    ax.set_ylabel("test error (%)")
    ax.set_title("Test error: each model and the ensemble")
    if room <= 100:
        ax.legend(fontsize="small", loc="upper right")
    else:
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    save_figure(fig, path)
    return fig


def plot_certainty(probabilities: np.ndarray, images: np.ndarray, labels: np.ndarray, votes: np.ndarray,
                   count: int, folder: Path) -> Dict[str, Any]:
    """The reference's certainty figures: for each of the first ``count`` test images, and for the
    first one the ensemble's majority vote (``votes``) gets wrong, a box plot over the models of the
    probability each gives each digit, beside the image. PNG and PDF in ``folder/certainty/``.

    One figure is redrawn for every image, at a fixed size: building and cropping a figure each
    time took twice as long. Returns the test images' figure names (relative to ``folder``, no
    suffix) and, in a list of at most one, the misclassified image's index, label, vote and figure."""
    pages = [(TEST_IMAGE_NAME.format(index), index, f"test image {index}") for index in range(min(count, len(labels)))]
    wrong = np.flatnonzero(votes != labels)
    misclassified = []
    if count > 0 and len(wrong):
        first = int(wrong[0])
        pages.append((MISCLASSIFIED_NAME.format(first), first, f"first misclassified, test image {first}"))
        misclassified.append({"index": first, "label": int(labels[first]), "vote": int(votes[first]),
                              "figure": f"{CERTAINTY_FOLDER}/{pages[-1][0]}"})
    target = Path(folder) / CERTAINTY_FOLDER
    written = set()
    if pages:
        n_models, _, n_classes = probabilities.shape
        fig, (left, right) = new_figure(8, 3.2, 1, 2, gridspec_kw={"width_ratios": [1, 2.4], "wspace": 0.25})
        fig.subplots_adjust(left=0.05, right=0.98, bottom=0.15, top=0.86)
        picture = left.imshow(images[pages[0][1]], cmap="gray", vmin=0, vmax=255)
        left.set_axis_off()
        right.set_xlim(-0.5, n_classes - 0.5)
        right.set_ylim(-0.05, 1.05)
        right.set_xticks(range(n_classes))
        right.set_xlabel("digit")
        right.set_ylabel("certainty (probability)")
        right.set_title(f"each digit's probability over {counted(n_models, 'model')}")
        boxes: Dict[str, list] = {}
        for name, index, title in pages:
            picture.set_data(images[index])
            left.set_title(f"{title}\nlabel {labels[index]}, ensemble vote {votes[index]}", fontsize=10)
            for artist in (artist for group in boxes.values() for artist in group):
                artist.remove()
            boxes = right.boxplot(probabilities[:, index, :], positions=range(n_classes), manage_ticks=False)
            written.update(path.name for path in save_figure(fig, target / name, FIGURE_SET_FORMATS, tight=False))
    if target.is_dir():  # an earlier run's figures that this one did not draw (another --certainty-images)
        for path in target.iterdir():
            if CERTAINTY_FILE.fullmatch(path.name) and path.name not in written:
                path.unlink()
    test_images = [f"{CERTAINTY_FOLDER}/{name}" for name, _, _ in pages[:len(pages) - len(misclassified)]]
    return {"test_images": test_images, "misclassified": misclassified}


#: what an epoch's loss is, by --epoch-loss (mnist_nn.train.train_epoch): the reference's sum over its
#: batches is not a per-image cross-entropy, and its size follows the number of batches
LOSS_LABELS = {"reference": "training loss (sum of the epoch's batch means)",
               "mean": "training loss (mean per image)"}


def plot_training_curves(rows: Sequence[Mapping[str, Any]], path: Path, epoch_loss: str = "reference") -> None:
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
    ax.set_ylabel(LOSS_LABELS.get(epoch_loss, "training loss"), fontsize="small")
    ax.set_yscale("log")
    ax.set_title("Training loss (grey: CV fits)")
    if any(points[0]["fold"] == "refit" for points in curves.values()):
        ax.legend(fontsize="small")
    save_figure(fig, path)
