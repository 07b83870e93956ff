"""mnist_nn's training against the reference's loop, its stopping rule, and its evaluation.

Real digits images, small nets: each test takes a fraction of a second.
"""
from __future__ import annotations

import argparse
import os
import warnings

import numpy as np
import pytest
import torch

from common.data import load_dataset
from common.devices import Device
from common.items import Item, item_seed
from mnist_nn.app import MnistNN, fit_key
from mnist_nn.search import Candidate
from mnist_nn.train import TOLERANCE, evaluate, fit, make_reproducible, new_net, predict_logits, should_stop, to_device

CANDIDATE = Candidate(n_conv_layer=4, kernel_size=5, n_hidden_layer=16, learning_rate=0.02, momentum=0.9)


@pytest.fixture(scope="module")
def data():
    return to_device(load_dataset("digits", subsample=400, seed=0), "cpu")


def reference_fit(data, index, candidate, seed, epochs, batch_size=10):
    """The reference's train_model, written out plainly: Net, nn.CrossEntropyLoss (the mean over
    each batch, a DataLoader's shorter last batch included), torch.optim.SGD; per-epoch losses,
    each the sum of the batches' mean losses (``loss_epoch += loss_i``)."""
    torch.manual_seed(seed)
    net = candidate.build()
    optimizer = torch.optim.SGD(net.parameters(), lr=candidate.learning_rate, momentum=candidate.momentum)
    loss_function = torch.nn.CrossEntropyLoss()
    x, y = data.x_train[index], data.y_train[index]
    losses = []
    for _ in range(epochs):
        total = 0.0
        for start in range(0, len(index), batch_size):
            images, labels = x[start:start + batch_size], y[start:start + batch_size]
            loss = loss_function(net(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
        losses.append(total)
    return net, losses


def test_fit_is_the_reference_loop_to_the_bit(data):
    """95 images: ten batches, the last of 5. Our index gathers from the data set's one tensor give
    the very weights the reference's loop over slices gives."""
    index = np.random.default_rng(0).choice(len(data.y_train), 95)
    net, log = fit(data.x_train, data.y_train, index, CANDIDATE, 3, 10, init_seed=3)
    reference, losses = reference_fit(data, index, CANDIDATE, seed=3, epochs=len(log))
    assert isinstance(net, torch.nn.Module) and not net.training
    for (name, ours), (_, theirs) in zip(net.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(ours, theirs), name
    assert [entry["loss"] for entry in log] == pytest.approx(losses, rel=1e-5)
    assert [entry["epoch"] for entry in log] == list(range(1, len(log) + 1))
    assert all(0 <= entry["error"] <= 1 and entry["samples_per_s"] > 0 for entry in log)


def test_a_fit_stops_by_the_rule_and_says_each_epoch_as_it_ends(data):
    index = np.arange(200)
    seen = []
    _, log = fit(data.x_train, data.y_train, index, CANDIDATE, 12, 10, init_seed=1, on_epoch=seen.append)
    assert seen == log
    losses = [entry["loss"] for entry in log]
    assert all(later <= TOLERANCE * earlier for earlier, later in zip(losses, losses[1:-1]))
    assert len(log) == 12 or losses[-1] > TOLERANCE * losses[-2]


def test_a_diverging_fit_stops_and_records_no_loss(data):
    wild = Candidate(4, 5, 16, learning_rate=1e4, momentum=0.99)
    data = to_device(load_dataset("digits", subsample=400, seed=0), "cpu", "data")  # overflows at once here
    _, log = fit(data.x_train, data.y_train, np.arange(100), wild, 10, 10, init_seed=0)
    assert log[-1]["loss"] is None and len(log) < 10


def test_stopping_rule_is_above_0_8_times_the_previous_loss():
    assert TOLERANCE == 0.8
    assert not should_stop(1.0, float("inf"), 1, 10)  # the first epoch has nothing to compare with
    assert not should_stop(0.79, 1.0, 2, 10)
    assert not should_stop(0.8, 1.0, 2, 10)  # the reference: equal goes on (loss > 0.8 x previous stops)
    assert should_stop(0.8, 1.0, 2, 10, rule="mean")  # --epoch-loss mean: equal is "not below": stop
    assert should_stop(0.8000001, 1.0, 2, 10)
    assert should_stop(0.9, 1.0, 2, 10)
    assert should_stop(0.1, 1.0, 10, 10)  # at --max-epochs
    assert should_stop(float("nan"), 1.0, 2, 10) and should_stop(float("inf"), 1.0, 2, 10)


def test_evaluation_in_large_batches_is_the_net_on_every_image(data, monkeypatch):
    import mnist_nn.train as train

    net = new_net(CANDIDATE, 2, "cpu").eval()
    with torch.no_grad():
        whole = net(data.x_train)
    monkeypatch.setattr(train, "EVAL_BYTES", 64 * net.hidden.in_features * 4)  # batches of 64 images
    assert train.eval_batch_size(net) == 64
    torch.testing.assert_close(predict_logits(net, data.x_train), whole)
    scores = evaluate(net, data.x_train, data.y_train)
    assert scores["error"] == pytest.approx(float((whole.argmax(1) != data.y_train).double().mean()))
    assert scores["loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(whole, data.y_train)), rel=1e-5)
    # the reference's validation loss: batches of 10 (the last of 5 here), their mean losses summed
    batches = evaluate(net, data.x_train[:395], data.y_train[:395], batch_size=10)["loss"]
    expected = sum(float(torch.nn.functional.cross_entropy(whole[i:min(i + 10, 395)], data.y_train[i:min(i + 10, 395)]))
                   for i in range(0, 395, 10))
    assert batches == pytest.approx(expected, rel=1e-5)


def test_a_folds_result_is_the_same_every_time_it_runs(tmp_path):
    """The app's run_item, as any worker of any layout runs it (same --threads): the same result."""
    args = argparse.Namespace(dataset="digits", data_dir=None, subsample=150, seed=5, folds=3, max_epochs=3,
                              batch_size=10, n_bootstrap=1, n_tuning=1, gpu="cpu", max_macs=None, results=tmp_path,
                              draws="reference", epoch_loss="reference", normalise="reference")
    app = MnistNN(args)
    tiny = Candidate(n_conv_layer=2, kernel_size=3, n_hidden_layer=16, learning_rate=0.05, momentum=0.9)
    item = Item(fit_key(0, 0, 1), {"kind": "fit", "bootstrap": 0, "candidate": 0, "fold": 1, "hyper": tiny.as_dict()})
    strip = lambda result: {**result, "log": [(e["epoch"], e["loss"], e["error"]) for e in result["log"]]}  # noqa: E731
    results = [strip(app.run_item(app.setup_worker(Device("cpu", 0)), item, item_seed(5, item.key))) for _ in range(2)]
    assert results[0] == results[1] and results[0]["epochs"] >= 1


def reproducibility_settings() -> tuple:
    backends = torch.backends
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            backends.cudnn.benchmark, backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32)


def test_fits_run_reproducibly_and_the_benchmark_gives_the_reference_torchs_defaults(data, monkeypatch):
    """One owner of the settings a fit runs under: a worker's setup makes them for its life; the
    benchmark's "ours" fits under them and hands torch's defaults back for the reference's style."""
    from benchmarks.bench_nn import ours_seconds

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # recorded, so that the test's own setting goes with it
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    reproducible = (True, True, False, False, False)
    restore = make_reproducible()
    try:
        assert reproducibility_settings() == reproducible
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # before any GPU work, as deterministic cuBLAS needs
    finally:
        restore()
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.allow_tf32 = True  # torch's defaults, as the reference ran
    defaults = reproducibility_settings()
    seen = []

    def fit_seeing_the_settings(*args, **kwargs):
        seen.append(reproducibility_settings())
        return None, [{"seconds": 1.0}]

    monkeypatch.setattr("benchmarks.bench_nn.fit", fit_seeing_the_settings)
    ours_seconds(data, np.arange(20), Candidate(2, 3, 16, 0.05, 0.9), epochs=1)
    assert seen == [reproducible] and reproducibility_settings() == defaults


def test_workers_sharing_a_gpu_give_back_its_cache_after_every_item(tmp_path, monkeypatch):
    """With --workers-per-gpu > 1 (the worker's device has a slot) torch.cuda.empty_cache() runs after
    each item, a failed one too. (torch.cuda.empty_cache is recorded: there is no CUDA here.)"""
    args = argparse.Namespace(dataset="digits", data_dir=None, subsample=150, seed=5, folds=3, max_epochs=1,
                              batch_size=10, n_bootstrap=1, n_tuning=1, gpu="cpu", max_macs=None, results=tmp_path,
                              draws="reference", epoch_loss="reference", normalise="reference")
    app = MnistNN(args)
    state = app.setup_worker(Device("cpu", 0))
    assert state["release_cache"] is False  # a CPU worker (as a GPU worker alone on its GPU) keeps its cache
    released = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: released.append(1))
    state["release_cache"] = True  # as setup_worker sets it for Device("cuda", 0, "0", slot=1)
    tiny = Candidate(n_conv_layer=2, kernel_size=3, n_hidden_layer=16, learning_rate=0.05, momentum=0.9)
    item = Item(fit_key(0, 0, 1), {"kind": "fit", "bootstrap": 0, "candidate": 0, "fold": 1, "hyper": tiny.as_dict()})
    app.run_item(state, item, item_seed(5, item.key))
    assert len(released) == 1
    broken = Item(fit_key(0, 0, 2), {**item.params, "fold": 7})  # no such fold: the item fails
    with pytest.raises(IndexError):
        app.run_item(state, broken, item_seed(5, broken.key))
    assert len(released) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_an_epoch_never_waits_for_the_device_inside_its_batch_loop():
    """torch.cuda's sync debug mode, on only from each batch loop's start to its epoch's log entry
    (set-up, the net's and the indexes' upload, not counted): none in the loop, then exactly the
    epoch's two reads (its loss and its errors)."""
    from benchmarks.gpu_check import count_synchronisations

    cuda = to_device(load_dataset("digits", subsample=400, seed=0), "cuda")
    counts = count_synchronisations(cuda, np.arange(300), CANDIDATE, 2)  # 30 batches an epoch
    assert counts["in_batch_loops"] == 0 and counts["after_batch_loops"] == 2 * counts["epochs"], counts


def test_synchronisations_are_watched_only_from_each_batch_loop_to_its_epochs_log(data, monkeypatch):
    """How the GPU test above counts, on the CPU: torch.cuda.set_sync_debug_mode (CUDA-only) is
    recorded, and the batch loop warns once as a synchronisation would. As torch does, switching
    the mode on the first time warns that it is a prototype that "does not yet detect all
    synchronizing operations": that notice is no synchronisation (seen on an H200, torch 2.11)."""
    from benchmarks.gpu_check import count_synchronisations
    from mnist_nn import train

    events = []

    def set_sync_debug_mode(debug_mode):  # torch.cuda's own name for it (torch/cuda/__init__.py)
        mode = debug_mode
        if mode != "default" and mode not in events:
            warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all "
                          "synchronizing operations (Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:1003.)",
                          stacklevel=2)
        events.append(mode)

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_sync_debug_mode)
    loop = train.train_epoch

    def one_sync_per_loop(*args, **kwargs):
        events.append("batch loop")
        warnings.warn("called a synchronizing CUDA operation", stacklevel=2)
        return loop(*args, **kwargs)

    monkeypatch.setattr(train, "train_epoch", one_sync_per_loop)
    counts = count_synchronisations(data, np.arange(100), CANDIDATE, 2)
    assert counts == {"in_batch_loops": counts["epochs"], "after_batch_loops": 0, "epochs": counts["epochs"]}
    assert counts["epochs"] >= 1
    assert events == ["warn", "batch loop", "default"] * counts["epochs"] + ["default"]
    assert train.train_epoch is one_sync_per_loop  # put back as it found it


def test_the_reference_normalisation_is_x_over_255_minus_half():
    from common.data import Dataset
    from mnist_nn.train import to_model_input

    images = np.array([[[0, 255] * 14] * 28], dtype=np.uint8)
    tiny = Dataset("tiny", images, np.array([1]), images, np.array([1]))
    data = to_device(tiny, "cpu")
    assert (data.mean, data.std) == (0.5, 1.0)
    assert torch.equal(data.x_train[0, 0, 0, :2], torch.tensor([-0.5, 0.5]))
    assert torch.equal(to_model_input(images, 0.5, 1.0), data.x_train)
    own = to_device(tiny, "cpu", "data")  # --normalise data: the training pixels' own mean and std
    assert own.mean == pytest.approx(0.5) and own.std == pytest.approx(0.5)


def test_the_big_nets_warning_counts_one_net_in_the_singular(caplog):
    from mnist_nn.app import warn_big_nets

    big, small = Candidate(950, 7, 596, 0.01, 0.5), Candidate(8, 5, 64, 0.01, 0.5)
    for candidates, start in (([big], "the one candidate has 274M weights (950 conv 7x7, 596 hidden"),
                              ([small, big], "1 of the 2 candidates has 274M weights ("),
                              ([big, small, big], "2 of the 3 candidates have over 100M weights, the biggest 274M (")):
        caplog.clear()
        warn_big_nets(candidates)
        (message,) = [record.getMessage() for record in caplog.records]
        assert message.startswith(start), message
        assert ("each of its fits" in message) == (candidates.count(big) == 1), message
    caplog.clear()
    warn_big_nets([small])
    assert not caplog.records
