"""Muon's orthogonalisation shared across DDP processes: owners balanced by cost, the same update
as every process doing all of it (bit for bit on CPU), and one orthogonalisation per optimizer
step whatever the gradient accumulation."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from lehr.engine.optim import muon_adamw, muon_work, newton_schulz
from lehr.engine.processes.launch import Launch
from lehr.engine.run.loop import train
from tests.engine.forked import run


def test_owners_balance_the_cost_and_agree_everywhere():
    shapes = [torch.Size(s) for s in [(256, 688)] * 3 + [(688, 256)] * 3 + [(256, 256)] * 12]
    owner = muon_work.owners(shapes, 2)
    load = [sum(s.numel() * min(s) for s, o in zip(shapes, owner, strict=True) if o == r) for r in range(2)]
    assert max(load) / min(load) < 1.1 and owner == muon_work.owners(shapes, 2)
    assert muon_work.owners(shapes, 1) == [0] * len(shapes)


def test_one_orthogonalisation_per_step_with_four_micro_batches(tiny_config, tmp_path, monkeypatch):
    calls, orthogonalise = [], newton_schulz.orthogonalise
    counted = lambda m, *how: calls.append(1) or orthogonalise(m, *how)  # noqa: E731
    for module in (muon_adamw, muon_work):  # one process: shared work runs the plain one
        monkeypatch.setattr(module, "orthogonalise", counted)
    summary = train(tiny_config(out_dir=str(tmp_path / "run"), batch_size=8, micro_batch=2, planned_steps=6))
    assert summary["step"] == 6 and len(calls) == 6


@pytest.mark.slow
def test_shared_orthogonalisation_is_the_redundant_update_bit_for_bit(tiny_config, tmp_path):
    base = dict(planned_steps=12, micro_batch=2, eval_every=6, ckpt_every=6, optimizer="muon")
    for work in muon_work.MUON_WORK:
        run(tiny_config(out_dir=str(tmp_path / work), muon_work=work, **base), Launch(nproc_per_node=2))
    shared, redundant = (load_file(tmp_path / w / "final" / "model.safetensors") for w in muon_work.MUON_WORK)
    assert shared.keys() == redundant.keys()
    for k in shared:
        assert torch.equal(shared[k], redundant[k]), k
    moments = [
        torch.load(tmp_path / w / "final" / "optimizer.pt", weights_only=True)["optimizer"]
        for w in muon_work.MUON_WORK
    ]
    assert str(moments[0]) == str(moments[1])
