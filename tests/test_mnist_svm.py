"""mnist_svm through its real command line: mpiexec, spawned workers, real digits and IDX files."""
from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import re
import shutil
import signal
import struct
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from common.items import Item
from helpers import assert_usage_error, journal_entries, read_summary, run, snapshot, start, stop_run, write_idx
from mnist_svm.app import MnistSvm
from mnist_svm.grid import REFIT_KEY, Grid, best_point, error_table, expected_cost, fit_key, grid_items

N_TUNING = 3  # 9 (C, gamma) pairs x 5 folds; on digits the best pair is ~1.3 % already
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def svm(*args: str) -> list:
    return ["-m", "mnist_svm", *args]


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory) -> Path:
    """One 2-rank run on digits, shared by the tests that only read its outputs."""
    results = tmp_path_factory.mktemp("svm") / "digits"
    proc = run(svm(str(N_TUNING), "--dataset", "digits", "--results", str(results), "--no-progress"), ranks=2)
    assert proc.returncode == 0, proc.stderr
    return results


# ----- the whole program -----
def test_a_resume_under_another_cv_or_multiclass_names_both_values(two_rank_run, tmp_path):
    """The refusal said "cv 'reference' (journal) vs the default (now)" for --cv stratified: the
    fingerprint leaves the non-default values out, and now names them."""
    results = tmp_path / "r"
    shutil.copytree(two_rank_run, results)
    before = snapshot(results)
    for flag, value, kept in (("--cv", "stratified", "reference"), ("--multiclass", "ovo", "ovr")):
        proc = run(svm(str(N_TUNING), "--dataset", "digits", "--results", str(results), flag, value, "--resume"))
        assert_usage_error(proc, f"{flag[2:]} {kept!r} (journal) vs {value!r} (now)")
    assert snapshot(results) == before


def test_two_ranks_on_digits_write_every_output(two_rank_run):
    results = two_rank_run
    for name in ["validation_error.npy", "fits.csv", "summary.json", "summary.md", "journal.jsonl",
                 "validation_heatmap.png", "validation_heatmap.svg", "validation_boxplots.png",
                 "validation_boxplots.svg", "timeline.png"]:
        assert (results / name).is_file(), name
    table = np.load(results / "validation_error.npy")
    assert table.shape == (5, N_TUNING, N_TUNING) and not np.isnan(table).any()
    with open(results / "fits.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 5 * N_TUNING ** 2
    assert {row["rank"] for row in rows} == {"0", "1"}, "both ranks should have fitted"
    first = rows[0]
    assert table[int(first["fold"]), int(first["i_gamma"]), int(first["i_C"])] == pytest.approx(float(first["error"]), abs=1e-6)
    assert "| best C |" in (results / "summary.md").read_text()
    said = read_summary(results)  # the answer first, under the title
    assert (results / "summary.md").read_text().splitlines()[2] == (
        f"**best C {said['best_C']:.4g}, gamma {said['best_gamma']:.4g}: cross-validation error "
        f"{said['cv_error'] * 100:.2f} %, test error {said['test_error'] * 100:.2f} %**")
    # fits of one (gamma, fold) run together and share their group's time: counted once, not per fit
    results_ = [e for e in journal_entries(results) if e.get("type") == "result"]
    fits = [e for e in results_ if e["key"] != REFIT_KEY]
    groups = {(e["start"], e["end"], e["worker"]) for e in fits}
    busy = sum(end - start for start, end, _ in groups) + sum(e["seconds"] for e in results_ if e["key"] == REFIT_KEY)
    assert max(e["group_size"] for e in fits) > 1
    assert read_summary(results)["item_seconds_total"] == pytest.approx(busy, rel=0.01, abs=0.01)
    assert sum(float(row["seconds"]) for row in rows) == pytest.approx(sum(end - start for start, end, _ in groups),
                                                                       rel=0.01, abs=0.01 * len(rows))


def test_plots_are_valid_png_files(two_rank_run):
    import matplotlib.image

    for name in ["validation_heatmap", "validation_boxplots"]:
        png = two_rank_run / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_SIGNATURE
        pixels = matplotlib.image.imread(png)
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
        assert pixels.std() > 0.01, "an empty image"
        assert (two_rank_run / f"{name}.svg").read_text().lstrip().startswith(("<?xml", "<svg"))


def test_best_pair_on_digits_is_accurate_and_refit_on_the_test_set(two_rank_run):
    result = read_summary(two_rank_run)
    table = np.load(two_rank_run / "validation_error.npy")
    assert result["failed_items"] == []
    assert result["cv_error"] < 0.05 and result["cv_folds"] == 5
    assert result["cv_error"] == pytest.approx(float(np.nanmean(table, axis=0).min()))
    assert result["best_C"] in Grid(N_TUNING, 5).c_values and result["best_gamma"] in Grid(N_TUNING, 5).gamma_values
    assert result["test_error"] < 0.05
    matrix = np.array(result["confusion_matrix"])
    assert matrix.shape == (10, 10) and matrix.sum() == 450  # the whole digits test set
    assert 1 - np.trace(matrix) / matrix.sum() == pytest.approx(result["test_error"])


def test_stopped_run_resumes_to_the_same_results_as_other_layouts(two_rank_run, tmp_path):
    """Determinism (1 rank x 2 workers == 2 ranks x 1 worker) and resume after SIGTERM."""
    clean = tmp_path / "clean"
    proc = run(svm(str(N_TUNING), "--dataset", "digits", "--workers", "2", "--results", str(clean),
                   "--no-progress"))
    assert proc.returncode == 0, proc.stderr
    resumed = tmp_path / "resumed"
    args = svm(str(N_TUNING), "--dataset", "digits", "--results", str(resumed), "--no-progress")
    stopped = stop_run(start(args, ranks=2), resumed, after=4, sig=signal.SIGTERM)
    assert stopped.returncode == 75, stopped.stderr
    done_before = {e["key"] for e in journal_entries(resumed) if e.get("type") == "result"}
    assert 4 <= len(done_before) < 5 * N_TUNING ** 2 + 1
    proc = run(args + ["--resume"], ranks=2)
    assert proc.returncode == 0, proc.stderr
    keys = [e["key"] for e in journal_entries(resumed) if e.get("type") == "result"]
    assert len(keys) == len(set(keys)) == 5 * N_TUNING ** 2 + 1, "an item was computed twice"
    reference = np.load(two_rank_run / "validation_error.npy")
    for folder in (clean, resumed):
        np.testing.assert_array_equal(np.load(folder / "validation_error.npy"), reference)
        for field in ("best_C", "best_gamma", "cv_error", "test_error", "confusion_matrix"):
            assert read_summary(folder)[field] == read_summary(two_rank_run)[field], field
    assert read_summary(resumed)["items_resumed"] == len(done_before)
    # the reference's timing line covers this run's fits only, and says so on a resume
    earlier = len(done_before - {REFIT_KEY})
    assert (f" s (this run's {5 * N_TUNING ** 2 - earlier} of {5 * N_TUNING ** 2} fits; the rest ran in an earlier one)"
            in proc.stdout.splitlines()[0]), proc.stdout
    assert re.search(r"- wall time: [0-9.]+ s \(this run\); item time: [0-9.]+ s \(this run\)\n",
                     (resumed / "summary.md").read_text())


# ----- bad input: one line, exit code 2, nothing written -----
@pytest.mark.parametrize("key, damage, problem", [
    (fit_key(1, 2, 3), lambda result: "garbage", "a str, not a JSON object"),
    (fit_key(1, 2, 3), lambda result: {k: v for k, v in result.items() if k != "error"}, "no 'error'"),
    (fit_key(1, 2, 3), lambda result: {**result, "n_support": "many"}, "'n_support' is a str"),
    (fit_key(1, 2, 3), lambda result: {**result, "error": -5.0}, "'error' is -5.0, outside [0, 1]"),
    (REFIT_KEY, lambda result: {**result, "confusion_matrix": ["x"]}, "'confusion_matrix' is not a square table of counts"),
    (REFIT_KEY, lambda result: {**result, "n_test": result["n_test"] + 1},
     "'confusion_matrix' counts 450 test images, not n_test 451"),
], ids=["not-an-object", "missing-field", "wrong-type", "impossible-error", "matrix-not-counts", "matrix-short"])
def test_a_journal_with_a_damaged_result_is_refused_and_left_as_it_was(two_rank_run, tmp_path, key, damage, problem):
    """A result edited or damaged in the journal: --resume says which, in one line, exit 2, instead of
    failing in the report with a traceback."""
    results = tmp_path / "r"
    shutil.copytree(two_rank_run, results)
    journal = results / "journal.jsonl"
    lines = journal.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if json.loads(line).get("key") == key)
    entry = json.loads(lines[index])
    lines[index] = json.dumps({**entry, "result": damage(entry["result"])})
    journal.write_text("\n".join(lines) + "\n")
    before = snapshot(results)
    proc = run(svm(str(N_TUNING), "--dataset", "digits", "--results", str(results), "--resume"))
    assert_usage_error(proc, f"result of {key} is not one mnist_svm writes ({problem})")
    assert snapshot(results) == before


def mnist_folder_with_corrupt_images(folder: Path) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(0)
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.arange(50) % 10, compress=True)
    write_idx(folder / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (20, 28, 28)), compress=True)
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.arange(20) % 10, compress=True)
    header = b"\x00\x00\x08\x03" + struct.pack(">3I", 50, 28, 28)
    (folder / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + b"\x00" * 1000))  # cut short
    return folder


TORCHVISION_LOADS = importlib.util.find_spec("torchvision") is not None


@pytest.mark.parametrize("case", ["n_tuning 0", "n_tuning -1", "unknown dataset", "missing mnist offline",
                                  "corrupt idx", "folds 1", "n_tuning huge", "empty data dir", "data dir for digits",
                                  "workers per gpu on cpu", "subsample too small for the folds"])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, case):
    results = tmp_path / "results"
    extra = {
        "n_tuning 0": (["0", "--dataset", "digits"], "n_tuning must be at least 1"),
        "n_tuning -1": (["-1", "--dataset", "digits"], "n_tuning must be at least 1"),
        "unknown dataset": (["2", "--dataset", "cifar"], "invalid choice: 'cifar'"),
        "missing mnist offline": (["2", "--dataset", "mnist", "--data-dir", str(tmp_path / "nowhere")],
                                  "--dataset digits"),
        "corrupt idx": (["2", "--dataset", "mnist", "--data-dir", str(tmp_path / "idx")],
                        "train-images-idx3-ubyte.gz': truncated"),
        "folds 1": (["2", "--dataset", "digits", "--folds", "1"], "--folds must be at least 2"),
        "n_tuning huge": (["201", "--dataset", "digits"], "n_tuning 201 with 5 folds is 202,005 fits; at most 100,000"),
        "empty data dir": (["2", "--dataset", "mnist", "--data-dir", ""],  # not the current folder
                           "argument --data-dir: expected a folder, got an empty path"),
        # flags that would be silently ignored
        "data dir for digits": (["2", "--dataset", "digits", "--data-dir", str(tmp_path)],
                                "with --dataset digits: the digits come with scikit-learn and are read from no folder"),
        "workers per gpu on cpu": (["2", "--dataset", "digits", "--gpu", "cpu", "--workers-per-gpu", "3"],
                                   "--workers-per-gpu 3 with --gpu cpu: workers share GPUs, and there are none"),
        # 10 passes the 2 images per fold; the refusal that follows says what does (it said "a larger --subsample")
        "subsample too small for the folds": (["2", "--dataset", "digits", "--subsample", "10"],
                                              "the smallest class of the training images has only 1, and each fold "
                                              "needs one of every class; use fewer folds or a --subsample of at least "
                                              "about 50 (5 images of each of the 10 classes)"),
    }
    argv, fragment = extra[case]
    if case == "missing mnist offline" and TORCHVISION_LOADS:
        pytest.skip("torchvision is installed: MNIST might be downloadable here")
    if case == "corrupt idx":
        mnist_folder_with_corrupt_images(tmp_path / "idx")
    before = snapshot(tmp_path)
    proc = run(svm(*argv, "--results", str(results)), ranks=2, timeout=60)
    assert_usage_error(proc, fragment)
    if case == "missing mnist offline":
        assert all(name in proc.stderr for name in ("train-images-idx3-ubyte", "t10k-labels-idx1-ubyte"))
    assert not results.exists()
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case", ["a file", "missing folder", "3 of 4 files", "name too long"])
def test_explicit_data_dir_is_the_only_place_looked_at(tmp_path, case):
    """--data-dir X that does not hold Fashion-MNIST is refused (one line naming what is missing),
    never replaced by Debian's copy in /usr/share/datasets."""
    data_dir = tmp_path / ("x" * 300 if case == "name too long" else "data\nsplit")  # a newline stays in the line
    if case == "a file":
        data_dir.write_bytes(b"")
    elif case == "3 of 4 files":
        data_dir.mkdir()
        for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte"):
            (data_dir / f"{stem}.gz").write_bytes(b"")
    results = tmp_path / "results"
    before = snapshot(tmp_path)
    proc = run(svm("1", "--dataset", "fashion-mnist", "--data-dir", str(data_dir), "--results", str(results)),
               timeout=60)
    expected = {"a file": "is not a folder", "missing folder": "does not exist",
                "3 of 4 files": "lacks t10k-labels-idx1-ubyte", "name too long": "File name too long"}[case]
    assert_usage_error(proc, expected, repr(str(data_dir)))
    assert not results.exists() and snapshot(tmp_path) == before


# ----- the parts, without MPI -----
def test_grid_matches_the_reference_and_keys_name_indexes():
    grid = Grid(4, 5)
    np.testing.assert_allclose(np.log10(grid.c_values), [-3, 0, 3, 6])
    np.testing.assert_allclose(np.log10(grid.gamma_values), np.linspace(-6, -2, 4))
    items = grid_items(grid)
    assert len(items) == 4 * 4 * 5 + 1
    assert items[0].key == "C=0000,gamma=0000,fold=0" and fit_key(3, 1, 2) == "C=0003,gamma=0001,fold=2"
    refit = items[-1]
    assert refit.key == REFIT_KEY and set(refit.after) == {item.key for item in items[:-1]}


def test_cost_puts_small_C_and_large_gamma_first():
    middle = expected_cost(10.0, 1e-4)
    assert expected_cost(1e-3, 1e-4) > 5 * middle
    assert expected_cost(10.0, 1e-2) > 5 * middle
    assert expected_cost(1e-3, 1e-6) > expected_cost(1e-1, 1e-6) > expected_cost(1e3, 1e-6)


def test_best_point_ignores_failed_fits_and_complete_fills_the_refit():
    grid = Grid(2, 3)
    results = {fit_key(c, g, f): {"error": 0.5} for c, g, f in grid.points()}
    results[fit_key(1, 0, 0)] = {"error": 0.1}
    results[fit_key(1, 0, 1)] = {"error": 0.2}
    results[fit_key(1, 0, 2)] = {"error": 0.15}
    del results[fit_key(0, 1, 2)]  # failed fit: NaN in the table
    table = error_table(grid, results)
    assert np.isnan(table[2, 1, 0]) and table.shape == (3, 2, 2)
    best = best_point(grid, table)
    assert (best["i_C"], best["i_gamma"], best["cv_folds"]) == (1, 0, 3)
    assert best["cv_error"] == pytest.approx(0.15)
    app = MnistSvm(Namespace(n_tuning=2, folds=3))
    refit = app.complete(Item(REFIT_KEY, {"kind": "refit"}), results)
    assert refit.params["C"] == grid.c_values[1] and refit.params["gamma"] == grid.gamma_values[0]
    with pytest.raises(RuntimeError):
        app.complete(Item(REFIT_KEY, {"kind": "refit"}), {})


def test_best_point_prefers_pairs_with_every_fold_done(recwarn):
    grid = Grid(2, 5)
    table = np.full((5, 2, 2), np.nan)
    table[:, 0, 0] = 0.01  # every fold done
    table[0, 1, 1] = 0.0  # one lucky fold of five
    best = best_point(grid, table)
    assert (best["i_C"], best["i_gamma"], best["cv_folds"], best["cv_error"]) == (0, 0, 5, pytest.approx(0.01))
    table[1, 0, 0] = np.nan  # no pair has every fold: the most folds (4) count
    table[:3, 1, 0] = 0.02  # 3 folds: not enough
    best = best_point(grid, table)
    assert (best["i_C"], best["i_gamma"], best["cv_folds"]) == (0, 0, 4)
    assert not [w for w in recwarn if "empty slice" in str(w.message)]  # the pair (1, 0) has no fold at all


def test_pairs_tied_with_the_best_are_named_in_the_summary():
    """The demo's best C 1000 had the same error (the same fold errors) as C 1e6 at its gamma, and
    summary.md named one best: the others are named now, the first in (gamma, C) order refitted."""
    grid = Grid(3, 2)
    table = np.full((2, 3, 3), 0.3)
    table[:, 1, 2] = table[:, 1, 0] = table[:, 2, 1] = [0.1, 0.2]  # three pairs at 15 %
    table[:, 0, 1] = [0.2, 0.1]  # the same mean from other folds: tied too
    best = best_point(grid, table)
    assert (best["i_gamma"], best["i_C"]) == (0, 1)  # the first in (gamma, C) order
    assert best["tied_with"] == [{"C": grid.c_values[c], "gamma": grid.gamma_values[g]} for g, c in ((1, 0), (1, 2), (2, 1))]
    app = MnistSvm(Namespace(n_tuning=3, folds=2))
    summary = {"dataset": "digits", "n_tuning": 3, "folds": 2, "fits_done": 18, "fits_total": 18, "best_C": best["C"],
               "best_gamma": best["gamma"], "best_tied_with": best["tied_with"], "cv_error": 0.15, "cv_folds": 2,
               "cv_error_std": 0.05, "test_error": 0.1}
    row = next(line for line in app.summary_markdown(summary).splitlines() if line.startswith("| tied with it"))
    assert row == "| tied with it (the first was refitted) | C 0.001 gamma 0.0001, C 1e+06 gamma 0.0001, C 31.62 gamma 0.01 |"
    alone = {**summary, "best_tied_with": []}
    assert "tied" not in app.summary_markdown(alone)


def test_fits_of_one_gamma_and_fold_share_their_kernel_and_get_the_same_results():
    """On scikit-learn workers the fits of one (gamma, fold) are a group: one training kernel for
    every C, and the results of each fit alone, to the bit."""
    from common.devices import Device

    app = MnistSvm(Namespace(n_tuning=3, folds=3, dataset="digits", data_dir=None, subsample=600, seed=0, gpu="cpu",
                             cv="reference", multiclass="ovr"))
    app.devices = [Device("cpu", 0)]
    fits = [item for item in app.items() if item.params["kind"] == "fit"]
    assert len({item.group for item in fits}) == 3 * 3  # (gamma, fold) pairs, each with 3 values of C
    state = app.setup_worker(Device("cpu", 0))
    group = [item for item in fits if item.group == fits[0].group]
    assert sorted(item.params["i_C"] for item in group) == [0, 1, 2]
    alone = [app.run_item(state, item, None) for item in group]
    assert app.run_group(state, group, [None] * len(group)) == alone
    train = state.folds[group[0].params["fold"]][0]
    kernel = state.backend.train_kernel(group[0].params["gamma"], train)
    before = kernel.copy()
    state.backend.fit(group[0].params["C"], group[0].params["gamma"], train, kernel)
    assert np.array_equal(kernel, before), "libsvm must only read the shared kernel"


def mnist_folder(folder: Path, seed: int) -> Path:
    """A small valid MNIST (60 training and 20 test images), its pixels drawn from ``seed``."""
    folder.mkdir()
    rng = np.random.default_rng(seed)
    write_idx(folder / "train-images-idx3-ubyte.gz", rng.integers(0, 256, (60, 28, 28)), compress=True)
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.arange(60) % 10, compress=True)
    write_idx(folder / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (20, 28, 28)), compress=True)
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.arange(20) % 10, compress=True)
    return folder


def test_resume_on_other_data_is_refused_and_on_a_moved_copy_goes_on(tmp_path):
    """The journal records what the items were computed on (a hash of the images and labels, not of
    the files): --resume with a --data-dir holding other images would mix two data sets' fits."""
    first, other = mnist_folder(tmp_path / "a", seed=1), mnist_folder(tmp_path / "b", seed=2)
    results = tmp_path / "r"
    flags = ["--dataset", "mnist", "--folds", "2", "--gpu", "cpu", "--no-progress", "--results", str(results)]
    done = run(["-m", "mnist_svm", "1", *flags, "--data-dir", str(first)])
    assert done.returncode == 0, done.stderr
    identity = json.loads((results / "journal.jsonl").read_text().splitlines()[0])["fingerprint"]["data_identity"]
    assert identity.startswith("sha256:")
    before = snapshot(results)
    refused = run(["-m", "mnist_svm", "1", *flags, "--data-dir", str(other), "--resume"])
    assert_usage_error(refused, f"cannot resume {str(results)!r}: its items were computed on other data (data "
                                f"{identity} (journal) vs sha256:")
    assert snapshot(results) == before
    moved = shutil.copytree(first, tmp_path / "moved")
    for packed in moved.glob("*.gz"):  # unpacked, as torchvision leaves them beside the .gz files
        packed.with_suffix("").write_bytes(gzip.decompress(packed.read_bytes()))
        packed.unlink()
    again = run(["-m", "mnist_svm", "1", *flags, "--data-dir", str(moved), "--resume"])
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("n_tuning", [3, 9], ids=["numbers in the cells", "hatched cells"])
def test_a_heatmap_cell_of_fewer_folds_than_the_title_says_is_marked(tmp_path, monkeypatch, n_tuning):
    """A pair with folds lost (timed out, failed for good) was shown as a plain number under the title
    "5-fold cross-validation error": the mean of 2 folds, as if of 5. Such a cell now says how many
    folds its mean is of (or is hatched, where the cells are too many for numbers), and the title
    says how many cells are so."""
    import matplotlib.figure

    from mnist_svm import plots
    from mnist_svm.grid import Grid

    grid = Grid(n_tuning=n_tuning, folds=5)
    table = np.full((5, n_tuning, n_tuning), 0.2)
    table[[0, 3, 4], 1, 0] = np.nan  # gamma 1, C 0: 2 of 5 folds
    table[:, 0, 1] = np.nan  # every fold lost: "failed", not partial
    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig) or [])
    plots.plot_heatmap(grid, table, 2, 2, tmp_path / "heatmap")
    [figure] = drawn
    assert isinstance(figure, matplotlib.figure.Figure)
    ax = figure.axes[0]
    assert ax.get_title().endswith("\n1 cell: the mean of the folds that finished"), ax.get_title()
    texts = [text.get_text() for text in ax.texts]
    if n_tuning <= 8:
        assert texts.count("20.0\n(2/5 folds)") == 1 and texts.count("failed") == 1, texts
        assert sum("folds" in text for text in texts) == 1, texts
    else:
        assert texts == [] and len(ax.patches) == 1 and ax.patches[0].get_hatch() == "///"


@pytest.mark.parametrize("n_tuning", [1, 2, 4, 7, 8, 9, 24])
def test_the_heatmaps_ticks_sit_on_its_cells_and_name_their_values(tmp_path, monkeypatch, n_tuning):
    """The axes were log10 C and log10 gamma with ticks at whole numbers, which fell between the rows
    of a 4-point grid (log10 gamma -4.67 read as 1e-5, where the box plots say gamma = 2.15e-05).
    Each tick now sits on a cell and names its value; a grid too fine for that names powers of ten."""
    from mnist_svm import plots
    from mnist_svm.grid import Grid

    grid = Grid(n_tuning=n_tuning, folds=5)
    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig) or [])
    plots.plot_heatmap(grid, np.full((5, n_tuning, n_tuning), 0.2), 0, 0, tmp_path / "heatmap")
    ax = drawn[0].axes[0]
    axes = ((ax.get_xticks(), ax.get_xticklabels(), grid.c_values), (ax.get_yticks(), ax.get_yticklabels(), grid.gamma_values))
    for ticks, labels, values in axes:
        texts = [label.get_text() for label in labels]
        if n_tuning <= 8:  # on each cell's centre, named with its value to 3 significant digits
            assert np.allclose(ticks, np.log10(values)), ticks
            assert [float(text) for text in texts] == pytest.approx(list(values), rel=5e-3), texts
        else:  # the grid's decades: log10 C from -3 to 6, log10 gamma from -6 to -2
            assert list(ticks) == list(range(round(np.log10(values[0])), round(np.log10(values[-1])) + 1)), ticks
            assert texts == [f"$10^{{{int(power)}}}$" for power in ticks], texts
    if n_tuning == 4:
        assert [label.get_text() for label in ax.get_yticklabels()] == ["1e-06", "2.15e-05", "0.000464", "0.01"]
        assert [label.get_text() for label in ax.get_xticklabels()] == ["0.001", "1", "1e+03", "1e+06"]
    # drawn, no two labels of an axis run into each other (8 values side by side did: "1392.68e+05.18e+04e+06")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(drawn[0]).draw()
    renderer = drawn[0].canvas.get_renderer()
    for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
        boxes = [label.get_window_extent(renderer) for label in labels if label.get_text()]
        assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:]), [label.get_text() for label in labels]


def test_the_heatmaps_colour_bar_names_values_across_a_range_within_a_decade(tmp_path, monkeypatch):
    """Errors from 5 % to 15.7 % on the log colour bar were labelled 5, 6, 7, 8, 9, 10 only (its
    decade's minor ticks), nothing for the upper half of the cells (a review): within a decade the
    bar now names evenly spaced values across the whole range."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from mnist_svm import plots
    from mnist_svm.grid import Grid

    grid = Grid(n_tuning=4, folds=5)
    table = np.broadcast_to(np.linspace(0.05, 0.157, 16).reshape(1, 4, 4), (5, 4, 4)).copy()
    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig) or [])
    plots.plot_heatmap(grid, table, 0, 0, tmp_path / "heatmap")
    FigureCanvasAgg(drawn[0]).draw()
    bar = drawn[0].axes[1]
    named = [float(label.get_text()) for label in bar.get_yticklabels() if label.get_text()]
    assert len(named) >= 3 and min(named) < 7 and max(named) > 13, named
    assert all(5 <= value <= 15.7 for value in named), named
