"""mnist_nn through its real command line: real mpiexec, spawned workers, digits data, signals.

The random search draws candidates from the reference's distribution, where most nets have
hundreds of millions of weights. ``helpers.NN_SMALL``'s ``--seed 1763`` with ``--draws keyed`` (each
candidate from its own key, as before the reference's draws became the default) is chosen (by a
search over seeds) because its two candidates are small (1.8M weights at most), so a whole run takes
seconds on a CPU.
"""
from __future__ import annotations

import argparse
import base64
import csv
import re
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from common.data import load_dataset
from common.devices import Device
from common.items import Item
from helpers import NN_SMALL, assert_usage_error, journal_entries, read_summary, run, snapshot, start, stop_run
from mnist_nn.app import MnistNN, cv_scores, fit_key, refit_key
from mnist_nn.model import load_saved_model
from mnist_nn.sampling import bootstrap_folds, fold_indexes
from mnist_nn.search import draw_candidate
from mnist_nn.train import predict_logits, to_model_input

#: the first wave (2 bootstraps x 1 candidate x 3 folds); bootstrap 0's fits take about 0.35 s each here: long
#: enough to stop a run inside it
FIRST_WAVE = 2 * 1 * 3


def mnist_nn(results: Path, *extra: str, ranks: int = 1, args=NN_SMALL):
    return run(["-m", "mnist_nn", *args, "--results", str(results), *extra], ranks=ranks, timeout=240)


@pytest.fixture
def clean_run(nn_small_run) -> Path:
    """One rank, one worker, start to end: the session's NN_SMALL run (tests/conftest.py)."""
    return nn_small_run.results


def model_state(results: Path, bootstrap: int) -> dict:
    return torch.load(results / "models" / f"bootstrap-{bootstrap}.pt", weights_only=True)


def test_a_run_writes_every_output(clean_run):
    rows = list(csv.DictReader((clean_run / "results.csv").open()))
    assert [int(r["bootstrap"]) for r in rows] == [0, 1]
    for row in rows:
        assert 0 <= float(row["test_error"]) <= 1 and 0 <= float(row["training_error"]) <= 1
        assert 1 <= int(row["epochs"]) <= 3
    log = list(csv.DictReader((clean_run / "training_log.csv").open()))
    assert {r["item"] for r in log} == {fit_key(b, 0, f) for b in range(2) for f in range(3)} | {refit_key(0), refit_key(1)}
    assert all(float(r["samples_per_s"]) > 0 and float(r["lr"]) > 0 for r in log)
    summary = read_summary(clean_run)
    assert summary["failed_items"] == []
    assert summary["model_test_errors"] == [float(r["test_error"]) for r in rows]
    assert 0 <= summary["ensemble_test_error"] <= 1
    assert summary["certainty_figures"], "no certainty figure"
    for name in ["ensemble_error.png", "ensemble_error.svg", "training_curves.png", "timeline.png", "summary.md",
                 "cv_results.csv", "models/bootstrap-0.json", "models/bootstrap-1.json",
                 *[f"{n}.png" for n in summary["certainty_figures"]]]:
        assert (clean_run / name).exists(), name
    assert [(m["bootstrap"], m["n_conv_layer"], m["test_error"]) for m in summary["chosen_models"]] == \
        [(int(r["bootstrap"]), int(r["n_conv_layer"]), float(r["test_error"])) for r in rows]
    worker_log = (clean_run / "logs" / "rank0-cpu0.log").read_text()  # each epoch as it ends, for tail -f
    assert f"{fit_key(0, 0, 0)} epoch 1: loss " in worker_log and f"{refit_key(1)} epoch 1: loss " in worker_log
    markdown = (clean_run / "summary.md").read_text()
    assert "ensemble test error" in markdown
    said = read_summary(clean_run)  # the answer first, under the title
    # in %, as the figure beside it and mnist_svm's summary (a fraction, 0.0200, was read as 0.02 %)
    assert markdown.splitlines()[2] == (f"**ensemble test error: {100 * said['ensemble_test_error']:.2f} % "
                                        f"(majority vote of 2 models)**"), markdown
    table = [line for line in markdown.splitlines() if line.startswith("| ") and "bootstrap" not in line]
    assert [line.split(" | ")[2] for line in table] == [r["n_conv_layer"] for r in rows], table
    assert [line.split(" | ")[-1] for line in table] == [f"{100 * float(r['test_error']):.2f} % |" for r in rows], table


def test_one_rank_and_two_ranks_by_two_workers_give_identical_results(clean_run, tmp_path):
    """The clean run has 1 rank, 1 worker; this one 2 x 2; both 1 thread a worker (results are the
    same for any layout at the same --threads)."""
    many = tmp_path / "many"
    proc = mnist_nn(many, "--workers", "2", ranks=2)
    assert proc.returncode == 0, proc.stderr
    # the layout really was 2 ranks x 2 workers; which rank ran what is the scheduler's choice (with
    # fits this short, rank 0's workers may finish most of them before rank 1's have started)
    start = next(e for e in journal_entries(many) if e.get("type") == "start")
    assert [len(rank["devices"]) for rank in start["layout"]] == [2, 2]
    for name in ("results.csv", "cv_results.csv"):
        assert (many / name).read_text() == (clean_run / name).read_text(), name
    for b in range(2):
        one, other = model_state(clean_run, b), model_state(many, b)
        assert one.keys() == other.keys() and all(torch.equal(one[k], other[k]) for k in one)


def test_a_run_stopped_in_the_first_wave_resumes_to_the_same_results(clean_run, tmp_path):
    results = tmp_path / "stopped"
    process = start(["-m", "mnist_nn", *NN_SMALL, "--results", str(results)])
    stopped = stop_run(process, results, after=1, sig=signal.SIGTERM)
    assert stopped.returncode == 75, stopped.stderr
    done = [e["key"] for e in journal_entries(results) if e.get("type") == "result"]
    assert 1 <= len(done) < FIRST_WAVE and not any(key.endswith("refit") for key in done), done
    assert not (results / "results.csv").exists()
    # no certainty figures (outputs only, which --resume may change): the results compared are the same
    resumed = mnist_nn(results, "--resume", "--certainty-images", "0")
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(results)
    assert summary["items_resumed"] == len(done) and summary["items_this_run"] == FIRST_WAVE + 2 - len(done)
    # the reference's "Time taken" is this run's wall time, and says so on a resume
    assert resumed.stdout.splitlines()[0] == (f"Time taken {summary['wall_seconds']} s (this run's "
                                              f"{FIRST_WAVE + 2 - len(done)} of {FIRST_WAVE + 2} items; the rest ran "
                                              f"in an earlier one)"), resumed.stdout
    assert (results / "results.csv").read_text() == (clean_run / "results.csv").read_text()


def test_resume_accepts_every_result_a_run_writes_and_refuses_a_damaged_one(clean_run):
    """``check_result`` on the clean run's journal: each fit and refit passes; a damaged epoch log,
    probability array or weights record is named (the run then stops in one line, exit 2)."""
    app = MnistNN(argparse.Namespace(seed=0))
    results = {e["key"]: e["result"] for e in journal_entries(clean_run) if e.get("type") == "result"}
    assert any(key.endswith("refit") for key in results) and len(results) == FIRST_WAVE + 2
    for key, result in results.items():
        app.check_result(key, result)
    refit = results[refit_key(0)]
    probabilities = refit["test_probabilities"]
    shape = probabilities["shape"]
    two = base64.b64encode(np.full(shape, 2.0, dtype="<f4").tobytes()).decode("ascii")
    diverged = base64.b64encode(np.full(shape, np.nan, dtype="<f4").tobytes()).decode("ascii")
    app.check_result(refit_key(0), {**refit, "test_probabilities": {**probabilities, "float32_base64": diverged}})
    for damaged, problem in [({**refit, "log": [{**refit["log"][0], "loss": "x"}]}, "'loss' is a str"),
                             ({**refit, "test_probabilities": {"shape": [3]}}, "no 'float32_base64'"),
                             ({**refit, "weights": {**refit["weights"], "bytes": None}}, "'bytes' is a NoneType"),
                             ({k: v for k, v in refit.items() if k != "test_error"}, "no 'test_error'"),
                             ({**refit, "test_error": 1.5}, "'test_error' is 1.5, outside [0, 1]"),
                             ({**refit, "log": [{**refit["log"][0], "error": -0.1}]}, "'error' is -0.1, outside [0, 1]"),
                             ({**refit, "epochs": -1}, "'epochs' is -1, outside [0, inf]"),
                             # what the report read and failed on (a traceback, outputs half rewritten)
                             ({**refit, "hyper": {**refit["hyper"], "n_conv_layer": "x"}}, "'n_conv_layer' is a str"),
                             ({**refit, "hyper": {"n_conv_layer": 8}}, "no 'kernel_size'"),
                             ({**refit, "test_probabilities": {**probabilities, "shape": [45, 10]}},
                              "not the 1800 of [45, 10]"),
                             ({**refit, "test_probabilities": {**probabilities, "shape": [10]}}, "not images x classes"),
                             ({**refit, "test_probabilities": {**probabilities, "float32_base64": "%%%"}},
                              "is not base64"),
                             ({**refit, "test_probabilities": {**probabilities, "float32_base64": two}},
                              "values outside [0, 1]")]:
        with pytest.raises(ValueError, match=re.escape(problem)):
            app.check_result(refit_key(0), damaged)
    with pytest.raises(ValueError, match="no 'val_error'"):
        app.check_result(fit_key(0, 0, 0), {"val_loss": 0.1, "epochs": 1, "log": []})


def test_resume_with_another_max_macs_is_refused_in_one_line(clean_run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(clean_run, copy)
    before = snapshot(copy)
    assert_usage_error(mnist_nn(copy, "--max-macs", "1e6", "--resume"), "max_macs the default (journal) vs 1000000.0 (now)")
    # --draws keyed (NN_SMALL's) is left out of the fingerprint: named as it was, not "the default"
    assert_usage_error(mnist_nn(copy, "--draws", "reference", "--resume"), "draws 'keyed' (journal) vs 'reference' (now)")
    assert snapshot(copy) == before


def test_rank_0_never_imports_torch(nn_small_run):
    """Rank 0 builds the items, hands them out and writes every output without torch (1.4 s of
    start-up on the development machine); only the workers need it. The session's NN_SMALL run
    says so at its end (tests/conftest.py)."""
    assert nn_small_run.rank_0_imported_torch is False
    assert (nn_small_run.results / "models" / "bootstrap-1.pt").exists()


def test_a_saved_model_reloads_and_reproduces_its_test_error(clean_run):
    dataset = load_dataset("digits")
    rows = list(csv.DictReader((clean_run / "results.csv").open()))
    for row in rows:
        net, params = load_saved_model(clean_run / "models" / f"bootstrap-{row['bootstrap']}.pt")
        assert (params["n_conv_layer"], params["kernel_size"]) == (int(row["n_conv_layer"]), int(row["kernel_size"]))
        images = to_model_input(dataset.x_test, **params["normalisation"])
        predictions = predict_logits(net, images).argmax(1).numpy()
        # exactly numpy's float64 mean, as the reference writes it (not a float32 mean's 0.07555555552244186)
        assert float(np.mean(predictions != dataset.y_test)) == float(row["test_error"])


@pytest.mark.parametrize("argv, fragment", [
    (["0", "1"], "n_bootstrap"),
    (["1", "1", "--batch-size", "0"], "--batch-size"),
    (["1", "1", "--max-epochs", "-1"], "--max-epochs"),
    (["1", "1", "--dataset", "nope"], "nope"),
    (["1", "1", "--dataset", "digits", "--subsample", "5"], "--subsample"),
    (["100000000", "100000000", "--dataset", "digits"], "at most 100,000"),
    (["1", "1", "--dataset", "digits", "--subsample", "200", "--batch-size", "100000"], "more than the 200"),
    (["1", "1", "--dataset", "digits", "--seed", "-1"], "--seed"),
    (["1", "1", "--dataset", "digits", "--max-macs", "5000"], "--max-macs"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv, fragment):
    results = tmp_path / "bad"
    proc = run(["-m", "mnist_nn", *argv, "--results", str(results), "--gpu", "cpu"], timeout=60)
    assert_usage_error(proc, fragment)
    assert snapshot(results) == {}


# ----- the pieces, without the engine -----
def test_candidates_follow_the_reference_distribution_and_the_seed_only():
    drawn = [draw_candidate(7, b, c) for b in range(20) for c in range(20)]
    assert drawn == [draw_candidate(7, b, c) for b in range(20) for c in range(20)]
    assert drawn[0] != draw_candidate(8, 0, 0)
    assert all(1 <= d.n_conv_layer <= 999 and 2 <= d.kernel_size <= 10 and 1 <= d.n_hidden_layer <= 1999 for d in drawn)
    assert all(1e-5 <= d.learning_rate <= 1e-1 and 1e-2 <= d.momentum <= 1 for d in drawn)
    assert len({d.kernel_size for d in drawn}) == 9


def test_bootstrap_resamples_within_folds():
    folds = bootstrap_folds(103, 5, seed=3, bootstrap=1)
    assert [len(f) for f in folds] == [21, 21, 21, 20, 20]
    assert all(np.array_equal(a, b) for a, b in zip(folds, bootstrap_folds(103, 5, seed=3, bootstrap=1)))
    assert sum(len(set(f)) for f in folds) < 103, "a bootstrap sample repeats some images"
    for i in range(5):
        for j in range(i + 1, 5):
            assert not set(folds[i]) & set(folds[j]), "an image in two folds"
    training, validation = fold_indexes(folds, 2)
    assert len(training) == 103 - 21 and np.array_equal(validation, folds[2])


def test_max_macs_draws_only_small_nets_and_changes_nothing_else():
    """Redrawn from the same stream: a candidate that fits is the reference's own draw."""
    limited = [draw_candidate(0, b, c, max_macs=2e7) for b in range(6) for c in range(6)]
    plain = [draw_candidate(0, b, c) for b in range(6) for c in range(6)]
    assert all(d.cost <= 2e7 and d.n_weights <= 2e7 for d in limited) and any(d.cost > 2e7 for d in plain)
    assert any(d.cost <= 2e7 for d in plain)
    assert all(a == b for a, b in zip(limited, plain) if b.cost <= 2e7)
    assert limited == [draw_candidate(0, b, c, max_macs=2e7) for b in range(6) for c in range(6)]


def test_on_a_cpu_rank_0_warns_once_before_nets_of_hundreds_of_millions_of_weights(caplog):
    args = argparse.Namespace(gpu="cpu", seed=0, folds=5, n_bootstrap=2, n_tuning=2, max_macs=None, draws="keyed")
    with caplog.at_level("WARNING", logger="multinode_gpu"):
        MnistNN(args).items()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "--max-macs" in warnings[0] and "M weights" in warnings[0], warnings
    caplog.clear()
    with caplog.at_level("WARNING", logger="multinode_gpu"):
        MnistNN(argparse.Namespace(**{**vars(args), "max_macs": 1e6})).items()
        on_gpu = MnistNN(argparse.Namespace(**{**vars(args), "gpu": "0"}))
        on_gpu.devices = [Device("cuda", 0)]  # what the engine sets from --gpu 0
        on_gpu.items()
    assert not caplog.records


def test_complete_refits_the_candidate_with_the_lowest_mean_cv_loss():
    app = MnistNN(type("Args", (), {"seed": 0, "n_tuning": 3, "folds": 2, "max_macs": None, "draws": "keyed"})())
    losses = {0: [0.5, 0.9], 1: [0.6, 0.6], 2: [0.1, None]}  # candidate 2 diverged on a fold
    results = {fit_key(4, c, f): {"val_loss": loss} for c, pair in losses.items() for f, loss in enumerate(pair)}
    assert cv_scores(results, 4, 3, 2) == {0: 0.7, 1: 0.6, 2: float("inf")}
    item = app.complete(Item(refit_key(4), {"kind": "refit", "bootstrap": 4}), results)
    assert item.params["candidate"] == 1 and item.params["cv_loss"] == pytest.approx(0.6)
    assert item.params["hyper"] == draw_candidate(0, 4, 1).as_dict()
    del results[fit_key(4, 1, 0)]  # a fold failed for good: that candidate is out
    assert app.complete(Item(refit_key(4), {"kind": "refit", "bootstrap": 4}), results).params["candidate"] == 0


def test_a_run_with_no_refit_still_lists_its_training_curves():
    """Every refit failed (timed out): summary.md said only "no ensemble", though training_curves
    (.png, .svg, .pdf), training_log.csv and cv_results.csv were written for the fits that ran."""
    from mnist_nn.report import summary_markdown

    text = summary_markdown({"ensemble_test_error": None, "model_test_errors": []})
    assert "No model was refitted: no ensemble." in text and "![training curves](training_curves.png)" in text
    assert "`training_log.csv`" in text and "`cv_results.csv`" in text and text.endswith("\n")


def test_an_ensemble_without_some_bootstraps_says_so_beside_its_error():
    """A refit that failed leaves its bootstrap without a model: the ensemble's error is then of
    fewer models than asked for, and summary.md and the closing line say so (a user quoting "the
    ensemble" error of 2 bootstraps was quoting a single model)."""
    from mnist_nn.report import summary_markdown

    summary = {"models": 1, "bootstraps": 2, "bootstraps_without_model": [0], "model_test_errors": [0.0511],
               "ensemble_test_error": 0.0511, "ensemble_test_error_mean_probability": 0.0511, "chosen_models": [],
               "wall_seconds": 3.0, "items_done": 21}
    text = summary_markdown(summary)
    assert "- models: 1 of 2 (bootstrap 0 without one: its refit did not finish); test error of each: 5.11 %" in text
    assert "- ensemble test error (of 1 of 2 models): majority vote 5.11 %" in text
    app = MnistNN.__new__(MnistNN)
    assert app.headline(None, summary)[1] == "ensemble test error (of 1 of 2 models): 0.0511"  # stdout: the reference's
    assert app.answer(summary) == "ensemble test error (of 1 of 2 models): 5.11 %"
    assert app.answer({**summary, "bootstraps": 1, "bootstraps_without_model": []}) == "ensemble test error: 5.11 %"
    several = {**summary, "bootstraps": 3, "bootstraps_without_model": [0, 2]}
    assert "- models: 1 of 3 (bootstraps 0, 2 without one: their refits did not finish)" in summary_markdown(several)
    whole = {**summary, "models": 2, "bootstraps_without_model": [], "model_test_errors": [0.05, 0.06]}
    assert "- models: 2; test error" in summary_markdown(whole) and "ensemble test error: majority" in summary_markdown(whole)


@pytest.mark.parametrize("epoch_loss, label", [("reference", "training loss (sum of the epoch's batch means)"),
                                               ("mean", "training loss (mean per image)")])
def test_the_training_curves_say_what_an_epochs_loss_is(tmp_path, monkeypatch, epoch_loss, label):
    """The y axis said "training loss" for the reference's sum of an epoch's batch means (6 to 107
    in the demo), which is not comparable with a per-image cross-entropy."""
    from mnist_nn import plots

    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig))
    rows = [{"item": "b0-c0-f0", "fold": 0, "epoch": e, "loss": 10.0 / e} for e in (1, 2, 3)]
    plots.plot_training_curves(rows, tmp_path / "curves", epoch_loss)
    assert drawn[0].axes[0].get_ylabel() == label
