"""Muon with AdamW, z-loss and loss-spike skipping: the step against torch's own optimizers, skips
that leave the optimizer untouched, exact resume, branches, and the refusals of bad settings."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from lehr.engine import optim
from lehr.engine.artifacts.checkpoint import CheckpointError, load_optimizer, load_weights
from lehr.engine.model import Transformer, preset
from lehr.engine.optim import newton_schulz
from lehr.engine.run.guard import StepGuard
from lehr.engine.run.loop import train
from tests import faults
from tests.engine.test_resume import assert_same_final, train_curve

MUON = dict(optimizer="muon", muon_lr=0.02, lr=3e-3)


def _muon_model(tiny_config):
    torch.manual_seed(0)
    model = Transformer(preset("tiny", 256))
    return model, optim.build(model, tiny_config(**MUON))


def _backward(model, x) -> None:
    model.zero_grad(set_to_none=True)
    model(x, x)[1].backward()


def test_muon_step_is_torchs_muon_and_fused_adamw(tiny_config, monkeypatch):
    """The same arithmetic as torch's own optimizers, bit for bit, around the same
    orthogonalisation: torch.optim.Muon orthogonalises with lehr's here, so that what is compared
    is everything else a step does (momentum, Nesterov, LR scale, decay, AdamW's groups). The
    orthogonalisations themselves are compared in the next test."""
    monkeypatch.setattr(
        torch.optim._muon, "_zeropower_via_newtonschulz", lambda g, *_: newton_schulz.orthogonalise([g])[0]
    )
    ours_model, ours = _muon_model(tiny_config)
    theirs_model = copy.deepcopy(ours_model)
    named = list(theirs_model.named_parameters())
    hidden = [p for n, p in named if optim.is_hidden_matrix(n, p)]
    assert len(hidden) == 7 * 2  # q, k, v, o and three MLP matrices per block
    muon = torch.optim.Muon(hidden, lr=MUON["muon_lr"], weight_decay=0.0, momentum=0.95)
    adamw = torch.optim.AdamW(
        [
            {"params": [p for n, p in named if p.dim() == 2 and not optim.is_hidden_matrix(n, p)]},
            {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=MUON["lr"],
        betas=(0.9, 0.95),
        weight_decay=0.1,
        fused=True,
    )
    x = torch.randint(0, 256, (4, 32))
    for _ in range(4):
        _backward(ours_model, x)
        ours.found_inf = torch.zeros(())  # as the loop hands it: a taken step
        ours.step()
        _backward(theirs_model, x)
        muon.step()
        adamw.step()
    for (name, a), b in zip(ours_model.named_parameters(), theirs_model.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_the_orthogonalisation_is_torchs_within_bf16_rounding():
    """lehr's Newton-Schulz (batched by shape; on a CPU without bf16 instructions its products in
    fp32, rounded to bf16 where torch's bf16 kernels round) against torch.optim.Muon's, one matrix
    at a time. The iteration multiplies small singular directions ~450-fold over its 5 steps, so one
    bf16 step of rounding apart early (two kernels' sums in another order) ends up to ~1% apart."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    torch.manual_seed(0)
    matrices = [torch.randn(*shape) for shape in ((64, 64), (64, 176), (176, 64), (256, 688))]
    ns = newton_schulz.ORTHOGONALISERS["newton_schulz"]
    for m, ours in zip(matrices, newton_schulz.orthogonalise(matrices), strict=True):
        theirs = _zeropower_via_newtonschulz(m, ns.steps[0], len(ns.steps), newton_schulz.NS_EPS)
        assert ours.dtype == theirs.dtype == torch.bfloat16 and ours.shape == theirs.shape
        off = (ours.float() - theirs.float()).norm() / theirs.float().norm()
        assert off < 2e-2, (tuple(m.shape), off.item())


def test_a_skipped_muon_step_leaves_weights_and_momentum_untouched(tiny_config):
    model, opt = _muon_model(tiny_config)
    x = torch.randint(0, 256, (4, 32))
    _backward(model, x)
    opt.found_inf = torch.zeros(())
    opt.step()
    weights, state = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    _backward(model, x)
    for p in model.parameters():
        p.grad.fill_(float("nan"))
    opt.found_inf = torch.ones(())
    opt.step()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    after = opt.state_dict()["state"]
    assert all(torch.equal(v, after[i][k]) for i, s in state["state"].items() for k, v in s.items())


def test_each_group_follows_the_schedule_from_its_own_peak(tiny_config):
    _, opt = _muon_model(tiny_config)
    optim.set_lr(opt, 1.5e-3)  # half the peak lr of 3e-3
    lrs = {g["algorithm"]: g["lr"] for g in opt.param_groups}
    assert lrs == {"muon": pytest.approx(0.01), "adamw": pytest.approx(1.5e-3)}


def test_muon_run_stops_and_resumes_exactly(tiny_config, tmp_path):
    decay = dict(anneal_start=20, anneal_steps=20, **MUON)
    train(tiny_config(out_dir=str(tmp_path / "a"), **decay))
    train(tiny_config(out_dir=str(tmp_path / "b"), end_step=13, **decay))
    resumed = train(tiny_config(out_dir=str(tmp_path / "b"), **decay))
    assert resumed["mode"] == "resume" and resumed["step"] == 40
    assert_same_final(tmp_path / "a", tmp_path / "b")
    assert train_curve(tmp_path / "a") == train_curve(tmp_path / "b")
    state = load_optimizer(tmp_path / "a" / "final", torch.device("cpu"))["optimizer"]["state"]
    assert any("momentum_buffer" in s for s in state.values()) and any("exp_avg" in s for s in state.values())


def test_a_non_finite_step_is_skipped_under_muon(tiny_config, monkeypatch):
    faults.nonfinite_at(monkeypatch, [7])
    summary = train(tiny_config(planned_steps=12, **MUON))
    assert summary["skips_total"] == 1 and summary["step"] == 12
    state = load_optimizer(Path(summary["final"]), torch.device("cpu"))["optimizer"]["state"]
    assert {float(s["step"]) for s in state.values() if "step" in s} == {11.0}  # AdamW's share skipped


def test_resume_with_the_other_optimizer_is_refused_and_a_fresh_branch_may_switch(tiny_config, tmp_path):
    train(tiny_config(end_step=10, **{**MUON, "optimizer": "adamw"}))
    with pytest.raises(CheckpointError, match=r"another configuration \(muon_lr, muon_momentum.*optimizer"):
        train(tiny_config(**MUON))
    start = str(tmp_path / "run" / "checkpoints" / "step_00000010")
    branch = dict(init_from=start, anneal_start=10, anneal_steps=10, end_step=14, **MUON)
    with pytest.raises(CheckpointError, match="made with optimizer adamw.*anneal.init_optimizer: false"):
        train(tiny_config(out_dir=str(tmp_path / "kept"), **branch))
    s = train(tiny_config(out_dir=str(tmp_path / "fresh"), init_optimizer=False, **branch))
    assert s["mode"] == "branch" and s["step"] == 14


def test_z_loss_keeps_the_logits_normaliser_small_and_logs_the_cross_entropy(tiny_config, tmp_path):
    def run(name, z):
        s = train(tiny_config(out_dir=str(tmp_path / name), planned_steps=30, log_every=1, z_loss=z))
        rows = [json.loads(r) for r in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        model = Transformer(preset("tiny", 512))
        load_weights(Path(s["final"]), model)
        x = torch.randint(0, 512, (4, 64), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            z2 = model(x)[0].logsumexp(-1).square().mean().item()
        return z2, [r["loss"] for r in rows if r["kind"] == "train"]

    plain, plain_losses = run("plain", 0.0)
    squeezed, z_losses = run("z", 0.1)
    assert squeezed < plain / 2
    assert z_losses[0] == pytest.approx(plain_losses[0], rel=1e-6)  # the cross-entropy, before any update


def test_the_guard_skips_a_spike_absorbs_a_lasting_shift_and_saves_its_window():
    norm = torch.tensor(1.0)
    calm = [4.0 + 0.01 * (i % 3) for i in range(8)]

    def calmed() -> StepGuard:
        guard = StepGuard(torch.device("cpu"), spike_sigma=3.0, spike_window=8)
        assert [guard.observe(norm, torch.tensor(x)).item() for x in calm] == [0.0] * 8
        return guard

    guard = calmed()
    assert guard.observe(norm, torch.tensor(9.0)).item() == 1.0  # a spike, once the window is full
    assert guard.observe(norm, torch.tensor(4.0)).item() == 0.0
    assert guard.counts()[2].item() == 1
    # A lasting change of level: its first step is skipped, then the widened window takes it,
    # so a new data mix cannot stall training.
    shifted = calmed()
    assert [shifted.observe(norm, torch.tensor(6.0)).item() for _ in range(4)] == [1.0, 0.0, 0.0, 0.0]
    saved = guard.state_dict()
    again = StepGuard(torch.device("cpu"), spike_sigma=3.0, spike_window=8)
    again.load_state_dict(json.loads(json.dumps(saved)))
    assert again.state_dict() == saved
    assert again.observe(norm, torch.tensor(50.0)).item() == guard.observe(norm, torch.tensor(50.0)).item()
    assert (
        guard.observe(torch.tensor(float("nan")), torch.tensor(4.0)).item() == 1.0
    )  # non-finite still counts


def test_spike_skipping_run_counts_skips_and_resumes_exactly(tiny_config, tmp_path):
    # A tight threshold makes real steps count as spikes on this tiny run.
    spiky = dict(spike_sigma=0.5, spike_window=4, anneal_start=20, anneal_steps=20)
    straight = train(tiny_config(out_dir=str(tmp_path / "a"), **spiky))
    assert straight["spikes_total"] > 0
    train(tiny_config(out_dir=str(tmp_path / "b"), end_step=17, **spiky))
    resumed = train(tiny_config(out_dir=str(tmp_path / "b"), **spiky))
    assert resumed["spikes_total"] == straight["spikes_total"]
    assert_same_final(tmp_path / "a", tmp_path / "b")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"optimizer": "lion"}, "optimizer = 'lion' must be one of adamw, muon"),
        ({"optimizer": "muon", "muon_lr": 0.0}, r"muon_lr = 0.0 must be positive"),
        ({"muon_lr": -0.01}, r"muon_lr = -0.01 must be positive"),
        ({"z_loss": -1e-4}, r"z_loss = -0.0001 must be >= 0"),
        ({"spike_sigma": -1.0}, r"spike_sigma = -1.0 must be >= 0"),
        ({"spike_window": 1}, r"spike_window = 1 must be at least 2"),
        ({"muon_momentum": 1.0}, r"muon_momentum = 1.0 must lie in \[0, 1\)"),
        ({"optimizer": "muon", "parallel": "fsdp", "muon_lr": 0.0}, r"muon_lr = 0.0 must be positive"),
        ({"muon_work": "halved"}, r"muon_work = 'halved' must be one of shared, redundant"),
    ],
)
def test_bad_optimizer_settings_are_refused(tiny_config, change, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**change)
