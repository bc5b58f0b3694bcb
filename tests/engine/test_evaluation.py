"""Held-out figures: the same as the plain forward's loss over every window, however the windows
fall into passes and the head into slices."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lehr.engine.artifacts.checkpoint import seed_all
from lehr.engine.evals.evaluation import HEAD_TOKENS, HeldOut, evaluate, window_nats, windows_per_pass
from lehr.engine.hardware import Hardware
from lehr.engine.model import Transformer, preset

CPU = Hardware(torch.device("cpu"), "fp32", None, "cpu")


@pytest.fixture
def model_and_held():
    seed_all(0)
    model = Transformer(preset("tiny", 512)).eval()
    seq_len = model.cfg.seq_len
    rng = np.random.default_rng(0)
    # More windows than one pass takes, and more tokens than one head slice, in both sources.
    n = 2 * windows_per_pass(seq_len, 1) + 5
    assert n * seq_len > HEAD_TOKENS
    windows = {name: rng.integers(0, 512, (n, seq_len + 1)).astype(np.int64) for name in ("a", "b")}
    return model, HeldOut(windows, {"a": 3.0, "b": 4.5})


def by_hand(model, windows: np.ndarray) -> np.ndarray:
    w = torch.from_numpy(windows)
    with torch.no_grad():
        logits, _ = model(w[:, :-1])
        nats = F.cross_entropy(logits.transpose(1, 2), w[:, 1:], reduction="none")
    return nats.double().sum(-1).numpy()


def test_held_out_figures_are_the_plain_forwards_loss_over_every_window(model_and_held):
    model, held = model_and_held
    got = evaluate(model, held, CPU, micro_batch=1)
    nats = {name: by_hand(model, w) for name, w in held.windows.items()}
    tokens = {name: w[:, 1:].size for name, w in held.windows.items()}
    for name in held.windows:
        loss = nats[name].sum() / tokens[name]
        assert got[name]["loss"] == pytest.approx(loss, rel=1e-6)
        assert got[name]["bpb"] == pytest.approx(loss / math.log(2) / held.bytes_per_token[name], rel=1e-6)
    all_bytes = sum(tokens[n] * held.bytes_per_token[n] for n in tokens)
    all_nats = sum(v.sum() for v in nats.values())
    assert got["heldout"]["bpb"] == pytest.approx(all_nats / math.log(2) / all_bytes, rel=1e-6)
    for name, per_window in window_nats(model, held, CPU, micro_batch=1).items():
        np.testing.assert_allclose(per_window, nats[name], rtol=1e-6)
