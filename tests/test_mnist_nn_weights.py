"""A refit's weights: embedded in its result when small; a big net's written straight to
models/bootstrap-<i>.pt, hashed on the way, with no host copy of the serialised bytes."""
from __future__ import annotations

import argparse
import base64
import hashlib
import io

import torch

import mnist_nn.app
from mnist_nn.app import MnistNN
from mnist_nn.search import Candidate

CANDIDATE = Candidate(n_conv_layer=2, kernel_size=3, n_hidden_layer=16, learning_rate=0.05, momentum=0.9)


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_small_nets_weights_are_embedded_in_the_result(tmp_path):
    net = CANDIDATE.build()
    weights = MnistNN(argparse.Namespace(results=tmp_path)).keep_weights(net, 3)
    raw = base64.b64decode(weights["embedded"])
    assert weights["sha256"] == hashlib.sha256(raw).hexdigest() and weights["bytes"] == len(raw)
    assert same_state(torch.load(io.BytesIO(raw), weights_only=True), net.state_dict())
    assert not (tmp_path / "models").exists()


def test_a_big_nets_weights_go_straight_to_a_file_with_its_hash(tmp_path, monkeypatch):
    monkeypatch.setattr(mnist_nn.app, "EMBED_LIMIT_BYTES", 1000)  # this net's 20 kB stand for 5.8 GB
    net = CANDIDATE.build()
    weights = MnistNN(argparse.Namespace(results=tmp_path)).keep_weights(net, 3)
    path = tmp_path / "models" / "bootstrap-3.pt"
    raw = path.read_bytes()
    assert weights == {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw), "embedded": None}
    assert same_state(torch.load(path, weights_only=True), net.state_dict())
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["bootstrap-3.pt"]  # no temporary file left
