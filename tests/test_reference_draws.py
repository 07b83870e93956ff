"""--dry-run (an engine feature) and mnist_nn's reference random draws: the candidates a dry run
plans equal the reference's scheme, reimplemented here from its code (mnist_nn/train.py,
sampling.py, model.py of shermanlo77/multinode-gpu-study), for its default seed."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_SEED = 169514335042358758700408908237337905507
N_DIGITS_TRAIN = 1347  # common.data's digits split (test_data checks it)


def reference_candidates(seed, n_bootstrap, n_tuning, n, k_fold=5):
    """The reference's stream: spawn per bootstrap, two bytes(8), permutation, folds, candidates."""
    out = {}
    for b, child in enumerate(np.random.SeedSequence(seed).spawn(n_bootstrap)):
        rng = np.random.default_rng(child)
        rng.bytes(8), rng.bytes(8)
        rng.permutation(n)
        edges = np.round(np.linspace(0, n, k_fold + 1)).astype(np.int32)
        for i in range(k_fold):
            rng.integers(edges[i], edges[i + 1], edges[i + 1] - edges[i])
        for c in range(n_tuning):
            out[(b, c)] = {"n_conv_layer": int(rng.integers(1, 1000)), "kernel_size": int(rng.integers(2, 11)),
                           "n_hidden_layer": int(rng.integers(1, 2000)),
                           "learning_rate": math.pow(10, rng.random() * 4 - 5),
                           "momentum": math.pow(10, rng.random() * 2 - 2)}
    return out


def test_dry_run_plans_the_reference_candidates_and_writes_nothing(tmp_path):
    results = tmp_path / "results"
    done = subprocess.run([sys.executable, "-m", "mnist_nn", "3", "4", "--dataset", "digits", "--dry-run",
                           "--results", str(results)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    fits = [line for line in lines if line["params"]["kind"] == "fit"]
    assert len(fits) == 3 * 4 * 5 and len(lines) == len(fits) + 3
    expected = reference_candidates(REFERENCE_SEED, 3, 4, N_DIGITS_TRAIN)
    for line in fits:
        p = line["params"]
        assert p["hyper"] == expected[(p["bootstrap"], p["candidate"])], line["key"]
    assert not results.exists() and list(tmp_path.iterdir()) == []


def test_reference_folds_are_contiguous_slices_of_the_permutation_resampled_within():
    from mnist_nn.sampling import reference_bootstrap

    folds, _ = reference_bootstrap(103, 5, REFERENCE_SEED, 2)
    rng = np.random.default_rng(np.random.SeedSequence(REFERENCE_SEED).spawn(3)[2])
    rng.bytes(8), rng.bytes(8)
    shuffled = rng.permutation(103)
    edges = np.round(np.linspace(0, 103, 6)).astype(int)
    for i, fold in enumerate(folds):
        assert np.array_equal(fold, shuffled[rng.integers(edges[i], edges[i + 1], edges[i + 1] - edges[i])])
        assert set(fold) <= set(shuffled[edges[i]:edges[i + 1]])


def test_a_seed_past_32_bits_is_taken_and_32_bit_consumers_derive_one():
    from common.items import seed32

    assert seed32(7) == 7 and 0 <= seed32(REFERENCE_SEED) < 2 ** 32
    done = subprocess.run([sys.executable, "-m", "mnist_svm", "2", "--dataset", "digits", "--dry-run",
                           "--seed", str(REFERENCE_SEED * 10 ** 6)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert all("key" in json.loads(line) for line in done.stdout.splitlines()) and done.stdout
