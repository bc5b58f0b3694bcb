"""Non-finite steps are skipped (optimizer untouched) and N in a row abort, leaving the last good
checkpoint as it was; the config validates its own values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lehr.engine.artifacts.checkpoint import Rolling, load_optimizer
from lehr.engine.run.loop import train
from lehr.engine.run.stopping import DivergedError
from tests import faults


def test_a_non_finite_step_is_skipped_and_counted(tiny_config, monkeypatch):
    faults.nonfinite_at(monkeypatch, [7])
    summary = train(tiny_config(planned_steps=12))
    assert summary["skips_total"] == 1 and summary["step"] == 12
    # The skipped update left AdamW's own step counter (and so its bias correction) behind by one;
    # the Muon groups' momentum is checked step by step in test_optim.
    opt = load_optimizer(Path(summary["final"]), torch.device("cpu"))["optimizer"]
    assert {float(s["step"]) for s in opt["state"].values() if "step" in s} == {11.0}
    weights = load_file(Path(summary["final"]) / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values())


def test_consecutive_non_finite_steps_abort_and_keep_the_last_checkpoint(tiny_config, tmp_path, monkeypatch):
    train(tiny_config(end_step=10))
    rolling = Rolling(tmp_path / "run" / "checkpoints", keep_last=2)
    before = {p.name: p.read_bytes() for p in rolling.latest_valid()[0].iterdir()}
    faults.nonfinite_at(monkeypatch, range(12, 20))
    with pytest.raises(DivergedError, match="3 consecutive non-finite steps.*untouched"):
        train(tiny_config(max_consecutive_skips=3))
    path, state = rolling.latest_valid()
    assert path.name == "step_00000010"
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before


@pytest.mark.parametrize(
    "change, message",
    [
        ({"lr": 0.0}, "lr = 0.0 must be positive"),
        ({"lr": -1e-3}, "lr = -0.001 must be positive"),
        ({"batch_size": 6, "micro_batch": 4}, "batch_size = 6 is not a multiple of micro_batch 4"),
        ({"decay_shape": "sqrt"}, "decay_shape = 'sqrt' must be one of linear, cosine, 1-sqrt"),
        ({"attention": "fast"}, "attention = 'fast' must be one of auto, flash, efficient, cudnn, math"),
        ({"stable_mix": {"gold": 0.0}}, r"stable_mix.gold = 0.0 must be a positive number"),
        ({"beta2": 1.0}, r"beta2 = 1.0 must lie in \[0, 1\)"),
    ],
)
def test_config_rejects_bad_values(tiny_config, change, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**change)
