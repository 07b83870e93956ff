"""What a user of the reference (shermanlo77/multinode-gpu-study) expects from the same command:
its closing lines on stdout, its torchvision download in ./MNIST/raw found without --data-dir,
and --results . writing beside the user's other files, never over them. Real small runs."""
from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import numpy as np
import pytest

from common.data import find_idx_files, load_dataset
from common.errors import UsageError
from common.results.layout import ENGINE_OUTPUTS, HOLD_NAME, LOGS_DIR
from helpers import assert_usage_error, read_summary, run, snapshot
from mnist_nn.app import MnistNN
from mnist_svm.app import MnistSvm
from test_data import idx_folder
from test_mnist_svm_reference import write_small_mnist

#: mnist_svm as a reference user runs it, on the ./MNIST/raw the tests write: no --data-dir
SVM = ["-m", "mnist_svm", "2", "--gpu", "cpu", "--no-progress", "--results", "."]

NUMBER = r"[0-9.e+-]+"


def reference_user_folder(tmp_path: Path) -> Path:
    """A folder as the reference leaves it: its download in MNIST/raw, and a user's own files."""
    folder = tmp_path / "work"
    write_small_mnist(folder)
    (folder / "notes.txt").write_text("mine\n")
    (folder / "plots").mkdir()
    (folder / "plots" / "old.pdf").write_bytes(b"%PDF mine")
    return folder


def undeclared(folder: Path, app_class: type, keep: set) -> list:
    """Top-level names in ``folder`` that are neither in ``keep`` nor declared as the run's own."""
    patterns = (*ENGINE_OUTPUTS, LOGS_DIR, *app_class.__new__(app_class).output_names())
    return sorted(p.name for p in folder.iterdir()
                  if p.name not in keep and not any(fnmatch.fnmatchcase(p.name, pattern) for pattern in patterns))


def test_mnist_svm_in_a_reference_users_folder(tmp_path):
    """No --data-dir, --results .: ./MNIST/raw is read (nothing downloaded into data/), the outputs
    land beside the user's files (untouched), and the reference's four closing lines end stdout."""
    folder = reference_user_folder(tmp_path)
    mine = {name: data for name, data in snapshot(folder).items() if not name.startswith("MNIST")}
    done = run(SVM, cwd=folder, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = read_summary(folder)
    assert summary["status"] == "complete" and summary["n_test"] == 40 and summary["n_train"] == 150
    assert not (folder / "data").exists()  # found in ./MNIST/raw, not downloaded
    assert (folder / "validation_error.npy").is_file() and (folder / "journal.jsonl").is_file()
    assert not (folder / HOLD_NAME).exists()
    assert {name: data for name, data in snapshot(folder).items() if name in mine} == mine
    assert undeclared(folder, MnistSvm, {"MNIST", "notes.txt", "plots"}) == []  # every output is declared
    lines = done.stdout.splitlines()
    assert len(lines) == 4, done.stdout
    assert re.fullmatch(rf"Time taken for k-fold validation: {NUMBER} s", lines[0]), lines[0]
    assert lines[1:] == [f"Best penalty parameter: {summary['best_C']}",
                         f"Best kernel parameter: {summary['best_gamma']}",
                         f"Test error: {summary['test_error'] * 100}%"]
    assert summary["best_C"] in 10.0 ** np.linspace(-3, 6, 2) and summary["best_gamma"] in 10.0 ** np.linspace(-6, -2, 2)


def test_dry_run_prints_only_the_plan(tmp_path):
    folder = reference_user_folder(tmp_path)
    before = snapshot(folder)
    done = run([*SVM, "--dry-run"], cwd=folder, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 * 2 * 5 + 1 and all("key" in json.loads(line) for line in lines)
    assert snapshot(folder) == before


@pytest.mark.parametrize("clash", ["summary.json", "validation_error.npy", "timeline.pdf", "logs/rank0.log"])
def test_results_dot_never_overwrites_a_file_named_like_an_output(tmp_path, clash):
    """Someone else's summary.json, the reference's validation_error.npy, a file in logs/: one line,
    exit 2, naming it; nothing written or changed."""
    folder = reference_user_folder(tmp_path)
    (folder / clash).parent.mkdir(exist_ok=True)
    (folder / clash).write_text("not ours\n")
    before = snapshot(folder)
    done = run(SVM, cwd=folder, timeout=300)
    assert_usage_error(done, "--results '.'", clash.split("/")[0], "no journal")
    assert done.stdout == ""
    assert snapshot(folder) == before and sorted(p.name for p in (folder / "plots").iterdir()) == ["old.pdf"]


def test_mnist_nn_headline_and_declared_outputs(nn_small_run):
    """The reference's 'Time taken T s' and 'ensemble test error: F' (a fraction), from summary.json;
    in a user's folder with ``--results .`` (the session's NN_SMALL run, tests/conftest.py)."""
    folder = nn_small_run.results
    summary = read_summary(folder)
    assert 0 <= summary["ensemble_test_error"] <= 1
    assert nn_small_run.stdout == [f"Time taken {summary['wall_seconds']} s",
                                   f"ensemble test error: {summary['ensemble_test_error']}"]
    assert (folder / "notes.txt").read_text() == "mine\n"
    assert undeclared(folder, MnistNN, {"notes.txt"}) == []


def test_data_lookup_order_without_data_dir(tmp_path, monkeypatch):
    """data/ first, then the reference's ./MNIST/raw; --data-dir alone when given; a missing
    data set's message names every place looked at."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as error:
        load_dataset("mnist")
    assert "'MNIST/raw'" in str(error.value) and "'data'" in str(error.value)
    idx_folder(tmp_path / "MNIST" / "raw")
    assert find_idx_files("mnist")["x_train"] == Path("MNIST/raw/train-images-idx3-ubyte")
    idx_folder(tmp_path / "data")
    assert find_idx_files("mnist")["x_train"] == Path("data/train-images-idx3-ubyte")
    assert find_idx_files("mnist", tmp_path / "elsewhere") is None
    idx_folder(tmp_path / "FashionMNIST" / "raw")
    assert find_idx_files("fashion-mnist")["x_test"] == Path("FashionMNIST/raw/t10k-images-idx3-ubyte")
