"""Golden losses of the tiny model's first 20 CPU steps under each optimizer: a refactor must not
change the math.

Regenerate only for an intended change: ``LEHR_UPDATE_GOLDEN=1 pytest tests/engine/test_golden.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lehr.engine.run.loop import train

GOLDEN = {
    "adamw": Path(__file__).with_name("golden_tiny_losses.json"),
    "muon": Path(__file__).with_name("golden_tiny_losses_muon.json"),
}


@pytest.mark.parametrize("optimizer", sorted(GOLDEN))
def test_tiny_model_first_20_steps_match_golden(tiny_config, optimizer):
    # The rates the files were made with: a new default LR is not a change of math.
    rates = dict(lr=3e-3, muon_lr=0.02)
    summary = train(
        tiny_config(
            planned_steps=20, log_every=1, eval_every=1000, ckpt_every=1000, optimizer=optimizer, **rates
        )
    )
    rows = [
        json.loads(line) for line in (Path(summary["out_dir"]) / "metrics.jsonl").read_text().splitlines()
    ]
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert len(losses) == 20
    if os.environ.get("LEHR_UPDATE_GOLDEN"):
        GOLDEN[optimizer].write_text(json.dumps(losses, indent=1))
    # Tolerance covers CPU kernels that differ across instruction sets, not changes of math.
    assert losses == pytest.approx(json.loads(GOLDEN[optimizer].read_text()), rel=2e-4)
