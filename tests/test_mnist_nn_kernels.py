"""The hidden layer's CPU kernels (mnist_nn/hidden_kernels.c): built with this machine's compiler,
checked against torch's products, and the AVX-512 and AVX2 builds against each other, bit for bit."""
import os
import shutil
import tempfile

import pytest
import torch

from mnist_nn import kernels
from mnist_nn.kernels import build, cpu_isa, load

pytestmark = [pytest.mark.skipif(cpu_isa() is None, reason="the kernels need x86-64 Linux with AVX2 and FMA"),
              pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None, reason="no C compiler")]

#: (batch, hidden rows, columns, first column): tails of every length, odd rows, more rows than
#: the backward pass does at once, batches past the forward pass's registers, unaligned starts
SHAPES = [(10, 53, 9680, 3), (10, 53, 9680, 0), (7, 5, 37, 1), (13, 4, 100, 5), (1, 1, 5, 0), (10, 2, 16, 0),
          (25, 3, 333, 2), (10, 9, 2100, 11)]


def builds():
    """Every build this CPU runs: AVX2 always, AVX-512 where it has it."""
    return ["avx2"] + (["avx512"] if cpu_isa() == "avx512" else [])


def step(isa, B, H, n, first, momentum=0.9, lr=0.01, seed=0):
    """One forward and one backward pass of ``isa``'s kernels on columns first..first+n of random
    tensors, and the same with torch's products: (kernels' tensors, torch's tensors, the full tensors)."""
    generator = torch.Generator().manual_seed(seed)
    width = first + n + 7  # columns on both sides of the block, which must stay untouched
    w = torch.randn(H, width, generator=generator) * 0.01
    v = torch.randn(H, width, generator=generator) * 0.001
    x = torch.randn(B, width, generator=generator).clamp_min(0)
    dz = torch.randn(B, H, generator=generator) * 0.1
    gi, out = torch.full((B, width), 7.0), torch.empty(B, H)
    w_ref, v_ref = w.clone(), v.clone()
    block = slice(first, first + n)
    hidden = load(isa)[0]
    hidden.forward(x[:, block], w[:, block], out)
    hidden.backward(x[:, block], dz, w[:, block], v[:, block], gi[:, block], momentum, lr)
    expected_out, expected_gi = x[:, block] @ w_ref[:, block].t(), dz @ w_ref[:, block]
    v_ref[:, block] = momentum * v_ref[:, block] + lr * (dz.t() @ x[:, block])
    w_ref[:, block] -= v_ref[:, block]
    return (out, gi[:, block], w, v), (expected_out, expected_gi, w_ref, v_ref), gi


@pytest.mark.parametrize("isa", builds())
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kernels_compute_what_torch_computes_and_touch_only_their_block(isa, shape):
    B, H, n, first = shape
    ours, expected, gi = step(isa, B, H, n, first)
    for got, want in zip(ours, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    w, v = ours[2], ours[3]
    w_ref, v_ref = expected[2], expected[3]
    outside = [slice(0, first), slice(first + n, None)]
    assert all(torch.equal(w[:, s], w_ref[:, s]) and torch.equal(v[:, s], v_ref[:, s]) for s in outside)
    assert all(bool((gi[:, s] == 7.0).all()) for s in outside)


@pytest.mark.skipif(cpu_isa() != "avx512", reason="this CPU has no AVX-512 to compare with AVX2")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_avx512_and_avx2_builds_give_the_same_bits(shape):
    wide, narrow = step("avx512", *shape)[0], step("avx2", *shape)[0]
    assert all(torch.equal(a, b) for a, b in zip(wide, narrow))


def test_a_build_is_cached_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = build("avx2")
    assert first.parent == tmp_path / "multinode-gpu" and first.exists()
    built_at = first.stat().st_mtime_ns
    assert build("avx2") == first and first.stat().st_mtime_ns == built_at
    assert sorted(p.name for p in first.parent.iterdir()) == sorted([first.name, "hidden_kernels.lock"])


def test_without_a_compiler_or_switched_off_training_falls_back_to_torch(monkeypatch):
    uncached = load.__wrapped__
    monkeypatch.setenv("CC", "no-such-compiler")
    assert uncached("avx2") == (None, "CPU kernels could not be built or loaded (no C compiler 'no-such-compiler'): "
                                      "torch's products")
    monkeypatch.setenv(kernels.SWITCH, "0")
    hidden, line = uncached()
    assert hidden is None and f"{kernels.SWITCH}=0" in line


def test_kernels_refuse_tensors_they_cannot_read():
    hidden = load("avx2")[0]
    w, out = torch.zeros(3, 8), torch.empty(2, 3)
    with pytest.raises(ValueError, match="contiguous rows"):
        hidden.forward(torch.zeros(8, 2).t(), w, out)
    with pytest.raises(ValueError, match="float32"):
        hidden.forward(torch.zeros(2, 8, dtype=torch.float64), w, out)
    with pytest.raises(ValueError, match="shapes that do not fit"):  # would write past ``out``
        hidden.forward(torch.zeros(4, 8), w, out)
    with pytest.raises(ValueError, match="shapes that do not fit"):
        hidden.backward(torch.zeros(2, 8), torch.zeros(2, 3), w, torch.zeros(3, 9)[:, :8], torch.zeros(2, 8), 0.9, 0.1)


def test_a_damaged_cached_library_is_built_again_and_cc_may_carry_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "cc -DCC_MAY_CARRY_FLAGS")
    library = build("avx2")
    library.write_bytes(b"not a shared library")
    hidden, line = load.__wrapped__("avx2")
    assert hidden is not None and line == f"CPU kernels: avx2 ({library})"
    assert library.stat().st_size > 1000
    assert sorted(p.name for p in library.parent.iterdir()) == sorted([library.name, "hidden_kernels.lock"])


def test_the_blocked_step_gives_nearly_the_same_net_with_kernels_or_torch():
    """A few SGD steps of a several-block net: kernels and torch's products agree to rounding."""
    from mnist_nn.blocked import BlockedNet, BlockRunner
    from mnist_nn.search import Candidate
    from mnist_nn.train import initial_state

    candidate = Candidate(40, 5, 30, learning_rate=0.02, momentum=0.9)  # 690k hidden weights: 2 blocks
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(50, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (1, 10, 1), generator=generator)
    onehot = torch.nn.functional.one_hot(labels.squeeze(-1), 10).float()
    weight = torch.full((1, 10, 1), 0.1)
    states = []
    with torch.inference_mode(), BlockRunner(2) as runner:
        for use_kernels in (True, False):
            net = BlockedNet(initial_state(candidate, 3, "cpu"), 28, 10, candidate.learning_rate,
                             candidate.momentum, runner, use_kernels=use_kernels)
            assert len(net.blocks) == 2 and (net.kernels is not None) == use_kernels
            for s in range(5):
                net.step(x, torch.arange(10 * (s % 5), 10 * (s % 5) + 10), onehot, weight, labels,
                         torch.empty(1, 10, 1), torch.empty(1, 10, dtype=torch.long))
            states.append(net.state_dict(0))
    for name in states[0]:
        torch.testing.assert_close(states[0][name], states[1][name], rtol=1e-4, atol=1e-6)


def test_where_the_cache_cannot_be_written_a_private_temporary_folder_is_used(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked / "cache"))  # under a file: cannot be made
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    private = tmp_path / f"multinode-gpu-{os.getuid()}"
    assert build("avx2").parent == private and private.stat().st_mode & 0o777 == 0o700
    private.chmod(0o777)  # a folder others can write into: never loaded from
    with pytest.raises(PermissionError, match="not this user's own folder"):
        build("avx2")
