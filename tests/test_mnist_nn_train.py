"""mnist_nn's hand-written training step against torch autograd + torch.optim.SGD, and stacking.

Real digits images, small nets: each test takes a fraction of a second.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from common.data import load_dataset
from common.items import Item
from mnist_nn.search import Candidate
from mnist_nn.stacked import NetStack
from mnist_nn import blocked
from mnist_nn.train import TOLERANCE, fit_group, initial_state, net_from_state, predict_logits, should_stop, to_device

CANDIDATE = Candidate(n_conv_layer=4, kernel_size=5, n_hidden_layer=16, learning_rate=0.02, momentum=0.9)
#: sizes that give the three nets 10, 11 and 10 steps, the last ones partly padded
SIZES = (100, 101, 95)


@pytest.fixture(scope="module")
def data():
    return to_device(load_dataset("digits", subsample=400, seed=0), "cpu")


@pytest.fixture
def one_thread():
    """Batched products give each net the bits it gets alone on one CPU thread (see stacked)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def indexes(n_train: int):
    rng = np.random.default_rng(0)
    return [rng.choice(n_train, size) for size in SIZES]


def autograd_fit(data, index, candidate, seed, epochs=1, batch_size=10):
    """The reference's loop: Net, cross-entropy (mean over the batch, a DataLoader's shorter last
    batch included), torch.optim.SGD; the last epoch's loss."""
    net = candidate.build()
    net.load_state_dict(initial_state(candidate, seed, "cpu"))
    optimizer = torch.optim.SGD(net.parameters(), lr=candidate.learning_rate, momentum=candidate.momentum)
    x, y = data.x_train[index], data.y_train[index]
    for _ in range(epochs):
        losses = []
        for start in range(0, len(index), batch_size):
            loss = F.cross_entropy(net(x[start:start + batch_size]), y[start:start + batch_size])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()) * len(x[start:start + batch_size]))
    return net, sum(losses) / len(index)


def assert_close_states(ours, theirs, rtol=1e-4, atol=1e-6):
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=rtol, atol=atol, msg=name)


def test_one_step_equals_autograd_and_torch_sgd(data):
    rows = torch.arange(10)
    net = CANDIDATE.build()
    net.load_state_dict(initial_state(CANDIDATE, 7, "cpu"))
    optimizer = torch.optim.SGD(net.parameters(), lr=CANDIDATE.learning_rate, momentum=CANDIDATE.momentum)
    loss = F.cross_entropy(net(data.x_train[rows]), data.y_train[rows])
    optimizer.zero_grad()
    loss.backward()
    gradients = {name: p.grad.clone() for name, p in net.named_parameters()}
    optimizer.step()

    stack = NetStack([initial_state(CANDIDATE, 7, "cpu")], 1, 28, 10, CANDIDATE.learning_rate, CANDIDATE.momentum,
                     "cpu")
    labels = data.y_train[rows].view(1, 10, 1)
    picked, predicted = torch.empty(1, 10, 1), torch.empty(1, 10, dtype=torch.long)
    with torch.inference_mode():
        stack.step(data.x_train, rows, F.one_hot(labels.view(1, 10), 10).float(), torch.full((1, 10, 1), 0.1),
                   labels, picked, predicted)
    assert float(-picked.mean()) == pytest.approx(float(loss.detach()), rel=1e-6)
    # after one step from rest the momentum is the gradient (times the learning rate here)
    ours = {name: g / CANDIDATE.learning_rate for name, g in stack.state_dict(0, momentum=True).items()}
    assert_close_states(ours, gradients)
    assert_close_states(stack.state_dict(0), dict(net.state_dict()))


def test_momentum_over_many_steps_follows_torch_sgd(data):
    index = np.arange(95)
    net, epoch_loss = autograd_fit(data, index, CANDIDATE, seed=3)
    (state, log), = fit_group(data.x_train, data.y_train, [index], CANDIDATE, 1, 10, [3])
    assert_close_states(state, dict(net.state_dict()), rtol=1e-3, atol=1e-5)
    assert log[0]["loss"] == pytest.approx(epoch_loss, rel=1e-5)


@pytest.mark.parametrize("batched", [True, False])
def test_a_stack_of_three_gives_each_net_the_bits_it_gets_alone(data, one_thread, batched):
    index = indexes(len(data.y_train))
    seen = []  # the on_epoch hook: each epoch of net k as it ends
    group = fit_group(data.x_train, data.y_train, index, CANDIDATE, 8, 10, [1, 2, 3], batched=batched,
                      on_epoch=lambda k, entry: seen.append((k, entry)))
    epochs = [len(log) for _, log in group]
    assert len(set(epochs)) > 1, f"the nets should stop at different epochs to test freezing: {epochs}"
    assert [[entry for j, entry in seen if j == k] for k in range(3)] == [log for _, log in group]
    for _, log in group:  # each net went on while its loss fell below 0.8 x the previous, and no longer
        losses = [entry["loss"] for entry in log]
        assert all(later < TOLERANCE * earlier for earlier, later in zip(losses, losses[1:-1]))
        assert len(log) == 8 or losses[-1] >= TOLERANCE * losses[-2]
    for k in range(3):
        (state, log), = fit_group(data.x_train, data.y_train, [index[k]], CANDIDATE, 8, 10, [k + 1],
                                  batched=batched)
        assert all(torch.equal(state[name], group[k][0][name]) for name in state), f"net {k}"
        strip = lambda entries: [(e["epoch"], e["loss"], e["error"]) for e in entries]  # noqa: E731
        assert strip(log) == strip(group[k][1])


@pytest.mark.parametrize("candidate", [CANDIDATE, Candidate(3, 4, 7, 0.01, 0.5)])
def test_each_net_of_an_unbatched_stack_has_its_blocks_as_aligned_as_a_net_alone(candidate):
    """Unbatched (as on CUDA), each net's products are issued alone; cuBLAS picks its kernel by the
    pointers' alignment, so net k of a stack must see the alignment a net alone sees."""
    def offsets(stack, k):  # byte offset of each block from the store's start, modulo 256
        base = stack.store.data_ptr()
        return [(views[name][k].data_ptr() - base) % 256 for views in (stack.params, stack.velocity)
                for name in sorted(views)]

    states = [initial_state(candidate, seed, "cpu") for seed in (1, 2, 3)]
    alone = offsets(NetStack(states[:1], 1, 28, 10, 0.01, 0.5, "cpu", batched=False), 0)
    stack = NetStack(states, 3, 28, 10, 0.01, 0.5, "cpu", batched=False)
    assert [offsets(stack, k) for k in range(3)] == [alone] * 3
    stack.keep([2, 0])  # the rows left after nets stop are repacked: still aligned
    assert [offsets(stack, k) for k in range(2)] == [alone] * 2


def test_padded_last_batches_and_stopped_nets_match_their_own_reference_run(data):
    """Nets whose epochs have fewer steps or that stopped earlier are not moved by the others' steps."""
    index = indexes(len(data.y_train))
    candidate = Candidate(4, 5, 16, learning_rate=0.05, momentum=0.9)
    group = fit_group(data.x_train, data.y_train, index, candidate, 4, 10, [1, 2, 3])
    epochs = [len(log) for _, log in group]
    assert len(set(epochs)) > 1, epochs
    for k in range(3):
        net, loss = autograd_fit(data, index[k], candidate, seed=k + 1, epochs=epochs[k])
        assert_close_states(group[k][0], dict(net.state_dict()), rtol=1e-3, atol=1e-5)
        assert group[k][1][-1]["loss"] == pytest.approx(loss, rel=1e-4)


@pytest.fixture
def threads():
    """Sets torch's thread count for the test; restores it afterwards."""
    saved = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(saved)


def test_a_net_split_in_blocks_gets_the_same_bits_on_any_number_of_threads(data, threads, monkeypatch):
    """One net on a CPU trains block by block (``blocked``): 1, 2 and 3 threads, same bits; and the
    blocked step still follows autograd + torch.optim.SGD."""
    candidate = Candidate(5, 5, 16, learning_rate=0.02, momentum=0.9)
    monkeypatch.setattr(blocked, "BLOCK_WEIGHTS", 576 * 16)  # one conv channel (24x24 positions x 16) a block
    index = indexes(len(data.y_train))[1]
    runs = []
    for count in (1, 2, 3):
        threads(count)
        runs.append(fit_group(data.x_train, data.y_train, [index], candidate, 3, 10, [4])[0])
    (state, log), = runs[:1]
    for other_state, other_log in runs[1:]:
        assert all(torch.equal(state[name], other_state[name]) for name in state)
        assert other_log == [{**entry, "samples_per_s": e["samples_per_s"], "seconds": e["seconds"]}
                             for entry, e in zip(log, other_log)]
    net, loss = autograd_fit(data, index, candidate, seed=4, epochs=len(log))
    assert_close_states(state, dict(net.state_dict()), rtol=1e-3, atol=1e-5)
    assert log[-1]["loss"] == pytest.approx(loss, rel=1e-4)
    stack = blocked.BlockedNet(initial_state(candidate, 4, "cpu"), 28, 10, 0.02, 0.9, blocked.BlockRunner(1))
    assert len(stack.blocks) == 5


def test_cpu_evaluation_gets_the_same_bits_on_any_number_of_threads(data, threads):
    net = net_from_state(CANDIDATE, initial_state(CANDIDATE, 2, "cpu"))
    outputs = []
    for count in (1, 2):
        threads(count)
        outputs.append(predict_logits(net, data.x_train))
    assert len(data.x_train) > 2 * 128  # several evaluation batches, shared out over the threads
    assert torch.equal(outputs[0], outputs[1])
    with torch.no_grad():
        torch.testing.assert_close(outputs[0], net(data.x_train), rtol=1e-5, atol=1e-5)


def test_a_fold_gets_the_same_result_alone_and_in_its_group_on_any_number_of_threads(threads):
    """The app's run_item and run_group: results (the journal's content) equal to the bit, on 1 and
    2 threads (a CPU stack trains on one BLAS thread, one net on blocks of one thread each)."""
    import argparse

    from common.devices import Device
    from common.items import item_seed
    from mnist_nn.app import MnistNN, fit_key

    args = argparse.Namespace(dataset="digits", data_dir=None, subsample=150, seed=5, folds=3, max_epochs=3,
                              batch_size=10, n_bootstrap=1, n_tuning=1, gpu=None)
    app = MnistNN(args)
    state = app.setup_worker(Device("cpu", 0))
    tiny = Candidate(n_conv_layer=2, kernel_size=3, n_hidden_layer=16, learning_rate=0.05, momentum=0.9)
    items = [Item(fit_key(0, 0, f), {"kind": "fit", "bootstrap": 0, "candidate": 0, "fold": f,
                                     "hyper": tiny.as_dict()}, group="b=00,c=00") for f in range(3)]
    seeds = [item_seed(args.seed, item.key) for item in items]
    strip = lambda result: {**result, "log": [(e["epoch"], e["loss"], e["error"]) for e in result["log"]]}  # noqa: E731
    threads(1)
    together = [strip(r) for r in app.run_group(state, items, seeds)]
    for count in (1, 2):
        threads(count)
        assert [strip(app.run_item(state, item, seed)) for item, seed in zip(items, seeds)] == together
        assert [strip(r) for r in app.run_group(state, items, seeds)] == together
        assert [strip(r) for r in app.run_group(state, items[1:], seeds[1:])] == together[1:]


def test_stopping_rule_is_not_below_0_8_times_the_previous_loss():
    assert TOLERANCE == 0.8
    assert not should_stop(1.0, float("inf"), 1, 10)  # the first epoch has nothing to compare with
    assert not should_stop(0.79, 1.0, 2, 10)
    assert should_stop(0.8, 1.0, 2, 10)  # equal is "not below": stop
    assert should_stop(0.9, 1.0, 2, 10)
    assert should_stop(0.1, 1.0, 10, 10)  # at --max-epochs
    assert should_stop(float("nan"), 1.0, 2, 10) and should_stop(float("inf"), 1.0, 2, 10)
