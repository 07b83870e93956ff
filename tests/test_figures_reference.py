"""The reference's figures, through the apps' real command lines on digits: every figure also as
PDF, mnist_nn's certainty figures (``--certainty-images``) and mnist_svm's box plot per gamma."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import NN_SMALL, assert_usage_error, read_summary, run, snapshot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVM_TUNING = 3


def assert_figure(stem: Path, formats: tuple) -> None:
    """Each of ``formats`` is there and is what its suffix says."""
    for form in formats:
        data = stem.with_suffix(f".{form}").read_bytes()
        assert data.startswith({"png": PNG_SIGNATURE, "pdf": b"%PDF", "svg": b"<?xml"}[form]), f"{stem}.{form}"
        assert len(data) > 1000, f"{stem}.{form} is nearly empty"


def certainty_files(results: Path) -> list:
    folder = results / "certainty"
    return sorted(path.name for path in folder.iterdir()) if folder.is_dir() else []


@pytest.fixture
def nn_run(nn_small_run) -> Path:
    """The session's small mnist_nn run (helpers.NN_SMALL: ``--certainty-images 3``; tests/conftest.py)."""
    assert "--certainty-images" in NN_SMALL and NN_SMALL[NN_SMALL.index("--certainty-images") + 1] == "3"
    return nn_small_run.results


def test_mnist_nn_writes_every_figure_as_pdf_too(nn_run):
    for stem in ("ensemble_error", "training_curves", "timeline"):
        assert_figure(nn_run / stem, ("png", "svg", "pdf"))


def test_certainty_images_3_gives_3_test_images_and_the_first_misclassified(nn_run):
    summary = read_summary(nn_run)
    wrong = summary["certainty_first_misclassified"]
    names = [f"test_image_{index}.{form}" for index in range(3) for form in ("pdf", "png")]
    if wrong is not None:
        names += [f"first_misclassified_{wrong['index']}.{form}" for form in ("pdf", "png")]
    assert certainty_files(nn_run) == sorted(names)
    for name in names:
        assert_figure(nn_run / "certainty" / Path(name).stem, ("png", "pdf"))
    markdown = (nn_run / "summary.md").read_text()
    shown = re.findall(r"!\[certainty[^]]*\]\((certainty/[^)]+)\.png\)", markdown)
    assert shown[:3] == [f"certainty/test_image_{index}" for index in range(3)]
    if wrong is None:
        assert len(shown) == 3 and "misclassifies no test image" in markdown
    else:
        # the ensemble's majority vote really gets it wrong, and no earlier test image
        assert wrong["vote"] != wrong["label"] and shown[3:] == [f"certainty/first_misclassified_{wrong['index']}"]
        assert wrong["figure"] == f"certainty/first_misclassified_{wrong['index']}"


def test_resume_with_certainty_images_0_is_accepted_and_leaves_none(nn_run, tmp_path):
    """The flag changes outputs, not results: not in the fingerprint, so --resume may change it;
    the earlier run's certainty figures go (no stale figures beside a summary that does not name them)."""
    copy = tmp_path / "copy"
    shutil.copytree(nn_run, copy)
    proc = run(["-m", "mnist_nn", *NN_SMALL, "--certainty-images", "0", "--results", str(copy), "--resume"],
               timeout=240)
    assert proc.returncode == 0, proc.stderr
    summary = read_summary(copy)
    assert summary["certainty_figures"] == [] and summary["certainty_first_misclassified"] is None
    assert certainty_files(copy) == []
    text = (copy / "summary.md").read_text()
    assert "![certainty" not in text and "the certainty figures as" not in text and "--certainty-images 0" in text
    assert (copy / "results.csv").read_text() == (nn_run / "results.csv").read_text()


def test_negative_certainty_images_is_one_line_and_exit_2(tmp_path):
    results = tmp_path / "bad"
    proc = run(["-m", "mnist_nn", "1", "1", "--dataset", "digits", "--certainty-images", "-1", "--gpu", "cpu",
                "--results", str(results)], timeout=60)
    assert_usage_error(proc, "--certainty-images")
    assert snapshot(results) == {}


def test_certainty_figures_of_a_whole_ensemble_without_the_engine(tmp_path):
    """plot_certainty alone: more images asked for than the test set has, and an ensemble that
    misclassifies nothing (no misclassified figure)."""
    from mnist_nn.plots import plot_certainty
    from mnist_nn.report import majority_votes

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 5)
    probabilities = np.full((3, 5, 10), 0.01, dtype=np.float32)
    probabilities[:, np.arange(5), labels] = 0.91
    images = rng.integers(0, 256, (5, 8, 8)).astype(np.uint8)
    votes = majority_votes(probabilities)
    assert (votes == labels).all()
    drawn = plot_certainty(probabilities, images, labels, votes, 100, tmp_path)
    assert drawn == {"test_images": [f"certainty/test_image_{i}" for i in range(5)], "misclassified": []}
    assert len(certainty_files(tmp_path)) == 10
    votes[4] = (labels[4] + 1) % 10
    drawn = plot_certainty(probabilities, images, labels, votes, 2, tmp_path)
    assert drawn["misclassified"] == [{"index": 4, "label": int(labels[4]), "vote": int(votes[4]),
                                       "figure": "certainty/first_misclassified_4"}]
    assert certainty_files(tmp_path) == ["first_misclassified_4.pdf", "first_misclassified_4.png",
                                         "test_image_0.pdf", "test_image_0.png", "test_image_1.pdf",
                                         "test_image_1.png"]


def test_mnist_svm_writes_one_box_plot_per_gamma_and_every_figure_as_pdf(tmp_path):
    results = tmp_path / "svm"
    proc = run(["-m", "mnist_svm", str(SVM_TUNING), "--dataset", "digits", "--subsample", "600", "--folds", "3",
                "--results", str(results), "--no-progress"], timeout=240)
    assert proc.returncode == 0, proc.stderr
    for stem in ("validation_heatmap", "validation_boxplots", "timeline"):
        assert_figure(results / stem, ("png", "svg", "pdf"))
    folder = results / "validation_error_by_gamma"
    assert sorted(path.name for path in folder.iterdir()) == sorted(
        f"validation_error_{i}.{form}" for i in range(SVM_TUNING) for form in ("png", "pdf"))
    for i in range(SVM_TUNING):
        assert_figure(folder / f"validation_error_{i}", ("png", "pdf"))
    summary = read_summary(results)
    assert summary["per_gamma_figures"] == [f"validation_error_by_gamma/validation_error_{i}" for i in range(SVM_TUNING)]
    assert "validation_error_by_gamma/validation_error_<i>.png" in (results / "summary.md").read_text()


def test_the_same_figure_gives_the_same_bytes_in_every_format(tmp_path):
    """No creation date or random ids: a rerun's figures differ only where the results do."""
    from common.results.outputs import FIGURE_FORMATS, new_figure, save_figure

    written = []
    for attempt in range(2):
        fig, ax = new_figure(3, 2)
        ax.plot([0, 1, 4], label="line")
        ax.set_title("title")
        ax.legend()
        written.append([path.read_bytes() for path in save_figure(fig, tmp_path / f"figure{attempt}")])
    assert [len(files) for files in written] == [len(FIGURE_FORMATS)] * 2
    assert written[0] == written[1]


@pytest.mark.parametrize("errors", [[0.012, 0.03, 0.02], [0.9, 0.88, 0.91], [1.0, 1.0, 1.0]])
def test_the_ensemble_error_axis_ends_at_100_percent_and_its_legend_covers_no_bar(tmp_path, errors):
    """Nets that did not learn (90% error on ten digits) stretched the axis to 130% to make room for
    the legend; the axis ends at 100% now, the legend under the axes where the bars leave it none."""
    from mnist_nn.plots import plot_ensemble_errors

    ensemble = {"majority_vote": min(errors), "mean_probability": min(errors)}
    fig = plot_ensemble_errors(errors, [0, 1, 2], ensemble, tmp_path / "ensemble_error")
    assert_figure(tmp_path / "ensemble_error", ("png", "svg", "pdf"))
    (ax,) = fig.axes
    bottom, top = ax.get_ylim()
    assert bottom == 0 and max(errors) * 100 <= top <= 100, (bottom, top)
    fig.draw_without_rendering()
    legend = ax.get_legend().get_window_extent()
    assert not any(legend.overlaps(bar.get_window_extent()) for bar in ax.patches), errors
