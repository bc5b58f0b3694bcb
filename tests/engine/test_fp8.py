"""precision fp8: the block matmuls run through torchao's float8 training (emulated on CPU). It
trains, resumes exactly (dynamic scales hold no state), and its checkpoints are plain models."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from lehr.engine.artifacts import checkpoint
from lehr.engine.model import Transformer
from lehr.engine.run.loop import train
from tests.engine.test_resume import assert_same_final


def test_fp8_trains_resumes_exactly_and_saves_a_plain_model(tiny_config, tmp_path):
    run = dict(precision="fp8", planned_steps=20, anneal_start=12, anneal_steps=8)
    straight = train(tiny_config(out_dir=str(tmp_path / "a"), **run))
    train(tiny_config(out_dir=str(tmp_path / "b"), end_step=9, **run))
    resumed = train(tiny_config(out_dir=str(tmp_path / "b"), **run))
    assert resumed["mode"] == "resume" and straight["step"] == resumed["step"] == 20
    assert_same_final(tmp_path / "a", tmp_path / "b")
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert losses[-1] < losses[0] - 0.3
    plain = Transformer(tiny_config().model)  # no torchao layers: the same names load into it
    checkpoint.load_weights(Path(straight["final"]), plain)


def test_fp8_differs_from_bf16_but_stays_close(tiny_config, tmp_path):
    run = dict(planned_steps=10, log_every=1, eval_every=1000, ckpt_every=1000)
    curves = {}
    for precision in ("bf16", "fp8"):
        summary = train(tiny_config(out_dir=str(tmp_path / precision), precision=precision, **run))
        rows = [
            json.loads(line) for line in (Path(summary["out_dir"]) / "metrics.jsonl").read_text().splitlines()
        ]
        curves[precision] = torch.tensor([r["loss"] for r in rows if r["kind"] == "train"])
    assert not torch.equal(curves["fp8"], curves["bf16"])  # the FP8 layers are really in the path
    assert torch.allclose(curves["fp8"], curves["bf16"], rtol=0.02)


def test_fp8_without_torchao_says_what_to_install(tiny_config, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    with pytest.raises(ValueError, match=r"precision fp8 needs torchao: pip install -e '.\[fp8\]'"):
        train(tiny_config(precision="fp8"))
