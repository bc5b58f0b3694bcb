"""The attention kernel is a hardware setting: another SDPA kernel computes the same losses, and one
the device cannot run is refused at start, naming the setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lehr.engine.run.loop import train


def losses(summary: dict) -> list[float]:
    rows = [
        json.loads(line) for line in (Path(summary["out_dir"]) / "metrics.jsonl").read_text().splitlines()
    ]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def test_the_math_kernel_trains_the_same_losses_as_the_default(tiny_config, tmp_path):
    run = dict(planned_steps=10, log_every=1, eval_every=1000, ckpt_every=1000)
    default = train(tiny_config(out_dir=str(tmp_path / "auto"), **run))
    math = train(tiny_config(out_dir=str(tmp_path / "math"), attention="math", **run))
    assert losses(math) == pytest.approx(losses(default), rel=1e-4)


def test_a_kernel_the_device_lacks_is_refused_at_start(tiny_config, tmp_path):
    with pytest.raises(ValueError, match="attention kernel 'cudnn' cannot run on cpu.*use attention: auto"):
        train(tiny_config(attention="cudnn"))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_attention_may_change_on_resume(tiny_config):
    train(tiny_config(end_step=10))
    resumed = train(tiny_config(planned_steps=20, attention="math"))
    assert resumed["mode"] == "resume" and resumed["step"] == 20
