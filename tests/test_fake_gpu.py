"""mnist_svm's GPU branch without a GPU: the fake cuML and CuPy of tests/fake_gpu (the pinned cuML
SVC's constructor exactly, fitting with scikit-learn) stand in for RAPIDS, so the branch's device
arrays, one-vs-rest fits, refit, predictions and summary run end to end here, and a keyword the
pinned cuML does not take fails as it would on a GPU."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.gpu_check import FAKE_GPU, SVM_FLIPS  # make gpu-check's own tolerance for cuML
from helpers import REPO, read_summary


def svm_run(results: Path, gpu: str, *extra: str) -> subprocess.CompletedProcess:
    """mnist_svm on the digits subset; ``gpu`` "0" pretends one GPU (CUDA_VISIBLE_DEVICES=0, the
    fakes first on PYTHONPATH)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if gpu != "cpu":
        env.update(CUDA_VISIBLE_DEVICES=gpu, PYTHONPATH=os.pathsep.join([str(FAKE_GPU), str(REPO)]))
    argv = [sys.executable, "-m", "mnist_svm", "3", "--dataset", "digits", "--subsample", "600", "--gpu", gpu,
            "--no-progress", "--results", str(results), *extra]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def cpu_and_gpu(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fake_gpu")
    runs = {kind: svm_run(folder / kind, gpu) for kind, gpu in (("cpu", "cpu"), ("gpu", "0"))}
    for kind, proc in runs.items():
        assert proc.returncode == 0, f"{kind}: {proc.stderr}"
    return folder, runs


def test_the_gpu_branch_runs_end_to_end_and_equals_the_cpu_branch(cpu_and_gpu):
    folder, runs = cpu_and_gpu
    summaries = {kind: read_summary(folder / kind) for kind in runs}
    assert summaries["gpu"]["backend"] == "cuml" and summaries["cpu"]["backend"] == "sklearn"
    with open(folder / "gpu" / "fits.csv") as handle:
        fits = list(csv.DictReader(handle))
    assert len(fits) == 3 * 3 * 5 and {fit["device"] for fit in fits} == {"gpu0"}
    # cuML fits each (C, gamma, fold) on its own: its rows' seconds are their own, not a group's share
    share = "each row's `seconds` is an even share of their time"
    assert share in (folder / "cpu" / "summary.md").read_text() and share not in (folder / "gpu" / "summary.md").read_text()
    errors = {kind: np.load(folder / kind / "validation_error.npy") for kind in runs}
    fold_rows = 600 // 5  # another solver on the "GPU" (libsvm's own kernel): a point on the margin may flip
    flips = np.abs(errors["gpu"] - errors["cpu"]) * fold_rows
    assert flips.max() <= SVM_FLIPS + 1e-9, flips
    assert (summaries["gpu"]["best_C"], summaries["gpu"]["best_gamma"]) == (
        summaries["cpu"]["best_C"], summaries["cpu"]["best_gamma"])
    assert abs(summaries["gpu"]["test_error"] - summaries["cpu"]["test_error"]) * summaries["gpu"]["n_test"] <= 5
    assert runs["gpu"].stdout.splitlines()[-1].startswith("Test error: ")


def test_one_vs_rest_on_the_device_predicts_as_scikit_learns_one_vs_rest(fake_gpu_modules):
    """The same rows, C and gamma: CumlBackend's binary SVC per class (argmax of the decision values)
    and SklearnBackend's OneVsRestClassifier on libsvm agree on nearly every prediction."""
    from common.data import load_dataset
    from mnist_svm.backends import CumlBackend, OneVsRestModel, SklearnBackend

    data = load_dataset("digits", subsample=500, seed=1)
    rows, c, gamma = np.arange(400), 10.0, 1e-3
    gpu, cpu = CumlBackend(data), SklearnBackend(data)
    model = gpu.fit(c, gamma, rows)
    assert isinstance(model, OneVsRestModel) and len(model.svcs) == 10
    predicted = gpu.predict(model, "test")
    assert predicted.dtype == np.int64 and predicted.shape == data.y_test.shape
    agree = np.mean(predicted == cpu.predict(cpu.fit(c, gamma, rows), "test"))
    assert agree >= 0.995, agree
    assert 0 < gpu.n_support(model) <= len(rows)


def test_ties_at_large_gamma_go_to_the_later_class_on_the_cpu_and_the_gpu(fake_gpu_modules):
    """At gamma 10 the kernel values between distinct images (1e-200 and less) vanish beside the
    intercepts, which are then the decision values: here most test images tie. Both backends give a tie to the later class, as the
    reference's scikit-learn 1.3.1 did (this scikit-learn's OneVsRestClassifier gives it to the earlier
    one), so the CPU and the GPU agree on every image and the test error is the reference's."""
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.svm import SVC

    from common.data import load_dataset
    from mnist_svm.backends import CumlBackend, SklearnBackend, last_argmax, standardise

    data = load_dataset("digits", subsample=400, seed=1)
    rows, c, gamma = np.arange(300), 1e-3, 10.0
    gpu, cpu = CumlBackend(data), SklearnBackend(data)
    on_gpu, on_cpu = gpu.predict(gpu.fit(c, gamma, rows), "test"), cpu.predict(cpu.fit(c, gamma, rows), "test")
    assert np.array_equal(on_gpu, on_cpu)
    plain = OneVsRestClassifier(SVC(C=c, gamma=gamma)).fit(standardise(data.x_train[rows]), data.y_train[rows])
    scores = plain.decision_function(standardise(data.x_test))
    ties = scores.max(axis=1, keepdims=True) == scores
    assert np.mean(ties.sum(axis=1) > 1) > 0.9  # the case this test is about: most images tie
    assert np.array_equal(on_cpu, plain.classes_[last_argmax(scores)])
    assert np.array_equal(last_argmax(np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 1.0, 0.0, 2.0]])), [2, 3])


def test_cuml_fits_the_reference_float64_pixels_in_double_precision(fake_gpu_modules):
    """The reference hands cuML float64 pixels, which its SVC keeps (``check_dtype`` float32 or
    float64) and fits in double precision; float32 pixels could move a point across the margin."""
    from common.data import load_dataset
    from mnist_svm.backends import CumlBackend

    model = CumlBackend(load_dataset("digits", subsample=300, seed=1)).fit(1.0, 1e-3, np.arange(200))
    assert {np.asarray(svc.support_vectors_).dtype for svc in model.svcs} == {np.dtype(np.float64)}


def test_one_vs_one_goes_through_cumls_own_multiclass_svc(fake_gpu_modules):
    """cuML's one-vs-one ``support_`` holds row indexes of the whole training data (each pair's
    model's own indexes mapped back), so the support vectors counted on the GPU are libsvm's own
    one-vs-one count on the CPU: the union of the pairs' support vectors."""
    from common.data import load_dataset
    from mnist_svm.backends import CumlBackend, SklearnBackend

    data = load_dataset("digits", subsample=300, seed=1)
    gpu = CumlBackend(data, multiclass="ovo")
    model = gpu.fit(10.0, 1e-3, np.arange(300))
    assert model.decision_function_shape == "ovo"
    assert np.mean(gpu.predict(model, "test") == data.y_test) > 0.8
    cpu = SklearnBackend(data, multiclass="ovo")
    expected = cpu.n_support(cpu.fit(10.0, 1e-3, np.arange(300)))
    assert abs(gpu.n_support(model) - expected) <= 0.02 * expected, (gpu.n_support(model), expected)
    labels = np.asarray(data.y_train)[:300]
    pairs = model._estimators
    assert len(pairs) == 45 and all(len(set(labels[np.asarray(pair.support_)])) == 2 for pair in pairs)


def test_a_keyword_the_pinned_cuml_does_not_take_is_a_type_error(fake_gpu_modules):
    from cuml.svm import SVC

    with pytest.raises(TypeError):
        SVC(C=1.0, multiclass_strategy="ovr")  # removed in cuML 25.06
    with pytest.raises(TypeError):
        SVC(1.0)  # keyword-only
    assert SVC(C=2.0, decision_function_shape="ovr").get_params()["C"] == 2.0


def test_a_cuml_that_cannot_be_imported_fails_each_workers_setup_not_every_fit(tmp_path):
    """cuML 25.06 (requirements-cu11.txt) imports ``_is_pandas_df`` from scikit-learn, which 1.8
    removed: ``import cuml`` raises. Found at each worker's setup (tried three times, then its
    items fail for good, saying why), not once per fit and retry of a grid of thousands."""
    broken = tmp_path / "broken"
    (broken / "cuml" / "svm").mkdir(parents=True)
    (broken / "cuml" / "__init__.py").write_text(
        "from sklearn.utils.validation import _is_fitted, _is_pandas_df  # noqa: F401  (cuML 25.06's compat)\n")
    (broken / "cuml" / "svm" / "__init__.py").write_text("")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0",
               PYTHONPATH=os.pathsep.join([str(broken), str(FAKE_GPU), str(REPO)]))  # the fake CuPy
    results = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "mnist_svm", "1", "--dataset", "digits", "--subsample", "300",
                           "--gpu", "0", "--no-progress", "--results", str(results)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    starts = [line for line in proc.stderr.splitlines() if "rank0-gpu0: worker could not start (ImportError" in line]
    assert len(starts) == 2 and "giving up on gpu0 after 3 failed starts: ImportError" in proc.stderr, proc.stderr
    assert "_is_pandas_df" in proc.stderr and "failed on rank0-gpu0 (attempt" not in proc.stderr, proc.stderr
    summary = read_summary(results)
    assert summary["items_done"] == 0 and len(summary["failed_items"]) == summary["items_total"] == 6
    assert all(f["error"].startswith("no worker could start: ImportError") for f in summary["failed_items"]), summary


def test_the_cuda_11_pins_keep_a_scikit_learn_that_cuml_25_06_imports():
    """cuML 25.06, the last for CUDA 11, needs scikit-learn below 1.8 (see the test above) and does
    not say so: on Python 3.11+ pip would pick 1.8 or later. requirements-cu11.txt pins it, within
    what setup.cfg allows."""
    import configparser

    from packaging.requirements import Requirement

    lines = (REPO / "requirements-cu11.txt").read_text().splitlines()
    pins = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    sklearn = [r.specifier for r in pins if r.name == "scikit-learn"]
    assert len(sklearn) == 1 and "1.8.0" not in sklearn[0] and "1.9.1" not in sklearn[0], sklearn
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    ours = [Requirement(line) for line in config["options"]["install_requires"].split("\n") if line.strip()]
    allowed = next(r.specifier for r in ours if r.name == "scikit-learn") & sklearn[0]
    assert "1.7.2" in allowed and any(r.name.startswith("cuml-cu11") and "25.6.1" in r.specifier for r in pins)


def test_one_binary_svc_per_class_predicts_as_cumls_own_one_vs_rest(fake_gpu_modules):
    """The reference's statistics: cuML's own one-vs-rest (scikit-learn's OneVsRestClassifier over
    binary cuML SVCs, ``decision_function_shape="ovr"``, the old ``multiclass_strategy="ovr"``) and
    CumlBackend's binary SVC per class on device arrays predict the same labels (same binary fits,
    argmax of their decision values)."""
    import cupy as cp
    from cuml.svm import SVC

    from common.data import load_dataset
    from mnist_svm.backends import CACHE_MB, CumlBackend

    data = load_dataset("digits", subsample=400, seed=2)
    rows, c, gamma = np.arange(300), 3.0, 1e-3
    backend = CumlBackend(data)
    ours = backend.predict(backend.fit(c, gamma, rows), "test")
    theirs = SVC(C=c, gamma=gamma, kernel="rbf", cache_size=CACHE_MB, decision_function_shape="ovr").fit(
        backend.x["train"][rows], backend.y["train"][rows]).predict(backend.x["test"])
    assert np.array_equal(ours, np.rint(cp.asnumpy(theirs)).astype(np.int64))
