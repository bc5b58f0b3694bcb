"""Muon under FSDP2, on 2 gloo processes: each sharded matrix gathered whole by its owner and
orthogonalised once, the result handed back as shards; against one process, after a kill -9,
through a non-finite step, from a DDP checkpoint, and on shard layouts FSDP does not make itself.

Two processes sum gradients in another order than one, and Muon's Newton-Schulz runs in bf16,
which turns those last-bit differences into bf16 roundings of the update (as under DDP,
tests/engine/test_ddp.py): FSDP + Muon matches one process within MUON_ATOL on the weights and
LOSS_ATOL on the logged losses, and itself (shared against redundant work, a resume at the same
process count) bit for bit."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from lehr.engine import optim
from lehr.engine.artifacts import checkpoint
from lehr.engine.artifacts.checkpoint import Rolling
from lehr.engine.model import Transformer
from lehr.engine.processes import launch, parallel
from lehr.engine.processes.launch import Launch
from lehr.files.atomic import sha256_file
from tests import faults
from tests.engine import compare_runs, detached
from tests.engine.compare_runs import weights
from tests.engine.forked import run

pytestmark = pytest.mark.slow
BASE = dict(planned_steps=20, micro_batch=2, eval_every=10, ckpt_every=5, optimizer="muon")
FSDP = dict(BASE, parallel="fsdp")
MUON_ATOL, LOSS_ATOL = 2e-2, 1e-3
TWO = Launch(nproc_per_node=2)


def assert_same(a: Path, b: Path, exact: bool) -> None:
    compare_runs.assert_same(a, b, exact=exact, atol=MUON_ATOL, loss_atol=LOSS_ATOL)


def test_fsdp_muon_trains_as_one_process_and_shares_the_work_exactly(tiny_config, tmp_path):
    run(tiny_config(out_dir=str(tmp_path / "one"), **BASE), Launch(nproc_per_node=1))
    for work in ("shared", "redundant"):
        summary = run(tiny_config(out_dir=str(tmp_path / work), muon_work=work, **FSDP), TWO)
        assert summary["step"] == 20
    assert_same(tmp_path / "one", tmp_path / "shared", exact=False)
    # Orthogonalising each matrix once on its owner is the update every rank would compute.
    assert_same(tmp_path / "redundant", tmp_path / "shared", exact=True)
    moments = [
        torch.load(tmp_path / w / "final" / "optimizer.pt", weights_only=True)["optimizer"]
        for w in ("shared", "redundant")
    ]
    assert str(moments[0]) == str(moments[1])
    # The momentum is kept sharded like the weights: each rank's DCP file holds about half of it.
    path, _ = Rolling(tmp_path / "shared" / "checkpoints", 2).latest_valid()
    from torch.distributed.checkpoint import FileSystemReader

    index = FileSystemReader(str(path / "dcp")).read_metadata().storage_data
    per_file: dict[str, int] = {}
    for key, info in index.items():
        if key.fqn.startswith("optimizer.state.") and "momentum_buffer" in key.fqn:
            per_file[info.relative_path] = per_file.get(info.relative_path, 0) + info.length
    assert sorted(per_file) == ["__0_0.distcp", "__1_0.distcp"]
    assert all(0.4 < size / sum(per_file.values()) < 0.6 for size in per_file.values()), per_file


def test_a_kill_9_under_fsdp_muon_resumes_at_two_processes_and_at_one(tiny_config, tmp_path):
    """A real SIGKILL of the whole process group mid-run (an async checkpoint save slowed so that
    the kill lands while training is under way); the run folder resumed at 2 processes gives the
    uninterrupted run bit for bit, and a copy of it resumed at 1 within Muon's tolerance."""
    cfg = dict(FSDP, planned_steps=30, async_save=True)
    run(tiny_config(out_dir=str(tmp_path / "straight"), **cfg), TWO)
    job, killed = tmp_path / "job.json", tiny_config(out_dir=str(tmp_path / "killed"), **cfg)
    proc = detached.start(killed, job, 2, faults.env(slow_checkpoint=2))
    checkpoints = tmp_path / "killed" / "checkpoints"
    detached.wait_until((checkpoints / "step_00000010" / "state.json").is_file, 180)
    detached.kill(proc, tmp_path / "killed")
    assert not (tmp_path / "killed" / "final").exists()
    shutil.copytree(tmp_path / "killed", tmp_path / "killed-one")
    for out, processes, exact in (("killed", TWO, True), ("killed-one", Launch(nproc_per_node=1), False)):
        summary = launch.run(tiny_config(out_dir=str(tmp_path / out), **cfg), processes)
        assert summary["mode"] == "resume" and summary["step"] == 30, summary
        assert_same(tmp_path / "straight", tmp_path / out, exact=exact)


def test_a_non_finite_step_under_fsdp_muon_is_skipped_on_every_rank(tiny_config, tmp_path, monkeypatch):
    """The 7th step's gradient is NaN (the fault counts steps from 0): the checkpoint after it holds
    every rank's shards of the weights, the momentum and AdamW's moments as they were after step 6."""
    cfg = tiny_config(out_dir=str(tmp_path / "run"), **dict(FSDP, planned_steps=7, ckpt_every=1))
    faults.nonfinite_at(monkeypatch, [6])  # in this process: the forked ranks inherit it
    summary = run(cfg, TWO)
    assert summary["skips_total"] == 1
    rolling = {p.name: p for p in (tmp_path / "run" / "checkpoints").iterdir()}
    saved = {}
    for step in (6, 7):
        dcp_to_torch_save(rolling[f"step_{step:08d}"] / "dcp", tmp_path / f"{step}.pt")
        saved[step] = torch.load(tmp_path / f"{step}.pt", weights_only=True)
    before, after = saved[6]["optimizer"]["state"], saved[7]["optimizer"]["state"]
    assert any("momentum_buffer" in s for s in before.values())
    assert str(before) == str(after)
    for k, t in saved[6]["model"].items():
        assert torch.equal(t, saved[7]["model"][k]), k


def test_a_ddp_muon_checkpoint_resumes_under_fsdp_and_branches(tiny_config, tmp_path):
    """The checkpoint of a DDP run with every rank orthogonalising everything (the old way) goes on
    under FSDP + Muon: its momentum, saved whole and keyed by name, is resharded; anneal branches
    from it keep or drop that momentum."""
    ddp = dict(BASE, muon_work="redundant")
    run(tiny_config(out_dir=str(tmp_path / "straight"), **ddp), TWO)
    run(tiny_config(out_dir=str(tmp_path / "moved"), end_step=10, **ddp), TWO)
    summary = run(tiny_config(out_dir=str(tmp_path / "moved"), **FSDP), TWO)
    assert summary["mode"] == "resume" and summary["resumed_from"].endswith("step_00000010")
    assert_same(tmp_path / "straight", tmp_path / "moved", exact=False)
    # An anneal branch from it under FSDP, with Muon's momentum kept (resharded from the whole
    # file) or fresh: the kept one trains as the same branch on one process does.
    branch = dict(FSDP, init_from=str(tmp_path / "moved" / "final"), anneal_start=20, anneal_steps=6)
    branch |= dict(planned_steps=26, end_step=26, eval_every=6, ckpt_every=6)
    for name, kept in (("kept", True), ("fresh", False)):
        s = run(tiny_config(out_dir=str(tmp_path / name), init_optimizer=kept, **branch), TWO)
        assert s["mode"] == "branch" and s["step"] == 26
    alone = dict(branch, parallel="ddp")
    run(tiny_config(out_dir=str(tmp_path / "kept-alone"), **alone), Launch(nproc_per_node=1))
    assert_same(tmp_path / "kept-alone", tmp_path / "kept", exact=False)
    kept, fresh = weights(tmp_path / "kept"), weights(tmp_path / "fresh")
    assert any(not torch.equal(kept[k], fresh[k]) for k in kept)


WORKER = textwrap.dedent(
    """
    import json, sys, torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from lehr.engine.optim import muon_work, newton_schulz

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)  # the same matrices on both ranks
    shapes = [(7, 5), (5, 7), (1, 6), (12, 4), (4, 4), (4, 4), (4, 4), (3, 9)]
    whole = [torch.randn(s) for s in shapes]
    reference = newton_schulz.orthogonalise(whole)
    same = {}
    for dim in (0, 1):
        params = [distribute_tensor(m, mesh, [Shard(dim)]) for m in whole]
        for shared, owner in ((True, muon_work.owners([p.shape for p in params], 2)), (False, None)):
            parts = muon_work.orthogonalise_sharded([p.to_local() for p in params], params, owner)
            full = [
                DTensor.from_local(y, mesh, [Shard(dim)], shape=p.shape, stride=p.stride()).full_tensor()
                for y, p in zip(parts, params)
            ]
            same[f"Shard({dim}) shared={shared}"] = all(torch.equal(a, b) for a, b in zip(full, reference))
    refused = {}
    grid = init_device_mesh("cpu", (1, 2))
    for label, layout in (("2-D", (grid, [Replicate(), Shard(0)])), ("replicated", (mesh, [Replicate()]))):
        try:
            muon_work.check_layout([("blocks.0.mlp.up.weight", distribute_tensor(whole[0], *layout))])
            refused[label] = None
        except ValueError as e:
            refused[label] = str(e)
    normuon = {}  # NorMuon needs each rank to hold whole rows
    for dim in (0, 1):
        try:
            sharded = distribute_tensor(whole[0], mesh, [Shard(dim)])
            muon_work.check_layout([("blocks.0.mlp.up.weight", sharded)], whole_rows=True)
            normuon[dim] = None
        except ValueError as e:
            normuon[dim] = str(e)
    if dist.get_rank() == 0:
        json.dump({"same": same, "refused": refused, "normuon": normuon}, open(sys.argv[1], "w"))
    dist.destroy_process_group()
    """
)


def test_any_one_dimensional_shard_layout_is_gathered_and_any_other_refused(tmp_path):
    """Row or column shards, uneven ones and a rank holding none: the owner's whole matrix is
    orthogonalised as one process would, bit for bit. A 2-D mesh (HSDP, tensor parallel) or a
    replicated matrix is refused naming the parameter and the fix, and so is NorMuon on shards of
    columns."""
    script, out = tmp_path / "worker.py", tmp_path / "out.json"
    script.write_text(WORKER)
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(script), str(out)],
        check=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    result = json.loads(out.read_text())
    assert all(result["same"].values()) and len(result["same"]) == 4, result["same"]
    for label, message in result["refused"].items():
        assert message and "blocks.0.mlp.up.weight" in message and "pretrain.optimizer: adamw" in message, (
            label
        )
    # NorMuon's per-neuron statistics need whole rows: shards of rows train, shards of columns are
    # refused, naming the matrix, the setting and the fix.
    assert result["normuon"]["0"] is None
    said = result["normuon"]["1"]
    assert "blocks.0.mlp.up.weight" in said and "sharded along dimension 1" in said
    assert "pretrain.muon_normuon_beta2: 0" in said


def test_an_optimizer_state_saved_by_position_is_refused_under_fsdp(tiny_config, tmp_path):
    """Checkpoints before 2026-12-01 kept the optimizer state keyed by parameter position (DDP
    only), which FSDP cannot match to its shards: refused, naming the way round, with the
    checkpoint untouched; under DDP it resumes as it always did."""
    cfg = tiny_config(end_step=4, **BASE)
    run(cfg, Launch(nproc_per_node=1))
    path, state = Rolling(tmp_path / "run" / "checkpoints", 2).latest_valid()
    # Rewrite the checkpoint as the old code wrote it: the same state, keyed by position.
    saved = checkpoint.load_optimizer(path, torch.device("cpu"))
    model = Transformer(cfg.model)
    opt = optim.build(model, cfg)
    parallel.load_full_optimizer_state(model, opt, saved["optimizer"])
    saved["optimizer"] = opt.state_dict()
    assert parallel.keyed_by_position(saved["optimizer"])
    torch.save(saved, path / "optimizer.pt")
    state["files"]["optimizer.pt"] = sha256_file(path / "optimizer.pt")
    raw = json.dumps(state).encode()
    (path / checkpoint.STATE).write_bytes(raw)
    (path / checkpoint.STATE_SHA).write_text(hashlib.sha256(raw).hexdigest())
    before = {f.name: f.read_bytes() for f in path.iterdir()}
    with pytest.raises(checkpoint.CheckpointError, match="keyed by parameter position.*parallel: ddp"):
        run(tiny_config(**FSDP), Launch(nproc_per_node=1))
    assert {f.name: f.read_bytes() for f in path.iterdir()} == before
    summary = run(tiny_config(**BASE), Launch(nproc_per_node=1))
    assert summary["mode"] == "resume" and summary["step"] == 20
