"""DDP through torchrun on gloo: 2 processes == 1 process with the same global batch, and
resume under DDP is exact."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from lehr.engine.processes import launch
from lehr.engine.processes.launch import Launch
from tests.engine.forked import run

pytestmark = pytest.mark.slow


def _weights(run_dir):
    return load_file(run_dir / "final" / "model.safetensors")


# Muon orthogonalises in bf16 (torch's Newton-Schulz), which turns the last-bit differences of a
# reduction done in another order into bf16 roundings of the update: DDP matches one process to
# that rounding, where AdamW's fp32 update matches to 1e-5.
# The first figure bounds the weights, the second the logged losses.
TOLERANCE = {"adamw": (1e-5, 1e-4), "muon": (2e-2, 1e-3)}


@pytest.mark.parametrize("optimizer", sorted(TOLERANCE))
def test_two_gloo_workers_match_one_process(tiny_config, tmp_path, optimizer):
    base = dict(planned_steps=16, micro_batch=2, eval_every=8, ckpt_every=8, optimizer=optimizer)
    one = run(tiny_config(out_dir=str(tmp_path / "one"), **base), Launch(nproc_per_node=1))
    two = run(tiny_config(out_dir=str(tmp_path / "two"), **base), Launch(nproc_per_node=2))
    assert one["step"] == two["step"] == 16
    a, b = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    weights, loss = TOLERANCE[optimizer]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4 if optimizer == "adamw" else 0.0, atol=weights)
    # The logged loss is the whole batch's under DDP too (the mean over ranks), not rank 0's share.
    losses = [
        [
            (r["step"], r["loss"])
            for r in map(json.loads, (tmp_path / run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "train"
        ]
        for run in ("one", "two")
    ]
    assert [s for s, _ in losses[0]] == [s for s, _ in losses[1]]
    for (_, x), (_, y) in zip(*losses, strict=True):
        assert abs(x - y) < loss, losses
    # Every rank's RNG state is in the checkpoint.
    assert (tmp_path / "two" / "final" / "rng_rank1.pt").is_file()


def test_resume_under_ddp_is_exact(tiny_config, tmp_path):
    base = dict(planned_steps=16, micro_batch=2, eval_every=8, ckpt_every=4)
    run(tiny_config(out_dir=str(tmp_path / "straight"), **base), Launch(nproc_per_node=2))
    run(tiny_config(out_dir=str(tmp_path / "chunked"), end_step=6, **base), Launch(nproc_per_node=2))
    summary = run(tiny_config(out_dir=str(tmp_path / "chunked"), **base), Launch(nproc_per_node=2))
    assert summary["mode"] == "resume"
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "chunked")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_more_processes_than_devices_is_refused(tiny_config):
    with pytest.raises(ValueError, match="exceeds the .* CPU cores"):
        launch.run(tiny_config(), Launch(nproc_per_node=512))
