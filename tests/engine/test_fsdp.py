"""FSDP2 on gloo (2 CPU processes, forked; torchrun for the kill and the two nodes): the same
training as DDP, exact resume,
resume across process counts and across DDP/FSDP, activation checkpointing, async saves that a
kill cannot half-write, and optimizer state sharded ~1/N per rank."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lehr.engine.artifacts.checkpoint import Rolling
from lehr.engine.processes import launch
from lehr.engine.processes.launch import Launch
from tests import faults
from tests.engine import compare_runs, detached
from tests.engine.forked import run

pytestmark = pytest.mark.slow
# These tests train with AdamW, whose state sharding is simplest to count; Muon under FSDP has
# tests/engine/test_muon_fsdp.py.
BASE = dict(planned_steps=16, micro_batch=2, eval_every=8, ckpt_every=4, optimizer="adamw")
# Two processes sum gradients in another order than one (and FSDP's reduce-scatter in another
# order than DDP's all-reduce): the same training within float32 rounding, not bit for bit.
RTOL, ATOL = 1e-4, 1e-5


def assert_close_runs(a: Path, b: Path, exact: bool = False) -> None:
    compare_runs.assert_same(a, b, exact=exact, rtol=RTOL, atol=ATOL, loss_atol=1e-4)


@pytest.fixture
def straight(tiny_config, trained):
    """The uninterrupted reference run of ``parallel`` on ``nproc`` processes, trained once per session."""
    return lambda parallel, nproc: trained(
        tiny_config(parallel=parallel, **BASE), Launch(nproc_per_node=nproc)
    )


def test_fsdp_trains_as_ddp_does_and_activation_checkpointing_changes_nothing(
    tiny_config, tmp_path, straight
):
    ddp, fsdp = straight("ddp", 2), straight("fsdp", 2)
    assert json.loads((fsdp / "final" / "state.json").read_text())["progress"]["step"] == 16
    assert_close_runs(ddp, fsdp)
    run(
        tiny_config(
            out_dir=str(tmp_path / "fsdp-ac"), parallel="fsdp", activation_checkpointing="blocks", **BASE
        ),
        Launch(nproc_per_node=2),
    )
    assert_close_runs(fsdp, tmp_path / "fsdp-ac", exact=True)  # recomputed, not changed
    # Rolling checkpoints are DCP shards, one file per rank, committed with every file's sha256.
    latest = Rolling(fsdp / "checkpoints", 2).latest_valid()
    path, state = latest
    assert {"dcp/__0_0.distcp", "dcp/__1_0.distcp", "dcp/.metadata"} <= set(state["files"])
    assert state["parallel"] == "fsdp" and state["progress"]["world_sizes"] == [[0, 2]]


def test_fsdp_resume_is_exact_at_the_same_process_count(tiny_config, tmp_path, straight):
    two = Launch(nproc_per_node=2)
    cfg = dict(parallel="fsdp", **BASE)
    run(tiny_config(out_dir=str(tmp_path / "chunked"), end_step=6, **cfg), two)
    summary = run(tiny_config(out_dir=str(tmp_path / "chunked"), **cfg), two)
    assert summary["mode"] == "resume"
    assert_close_runs(straight("fsdp", 2), tmp_path / "chunked", exact=True)


@pytest.mark.parametrize(
    "first, then",
    [
        (("fsdp", 2), ("fsdp", 1)),  # DCP shards of 2 resharded onto 1
        (("fsdp", 1), ("fsdp", 2)),  # ...and of 1 onto 2
        (("ddp", 2), ("ddp", 1)),  # a single-file checkpoint under another count
        (("ddp", 2), ("fsdp", 2)),  # a DDP checkpoint resumed under FSDP
        (("fsdp", 2), ("ddp", 2)),  # and the reverse
    ],
)
def test_resume_across_process_counts_and_parallel_kinds(
    tiny_config, tmp_path, trained, straight, first, then
):
    (kind_a, n_a), (kind_b, n_b) = first, then
    out = tmp_path / "moved"  # the first half, shared with the other cases that start the same way
    shutil.copytree(
        trained(tiny_config(parallel=kind_a, end_step=8, **BASE), Launch(nproc_per_node=n_a)), out
    )
    summary = run(tiny_config(out_dir=str(out), parallel=kind_b, **BASE), Launch(nproc_per_node=n_b))
    assert summary["mode"] == "resume" and summary["resumed_from"].endswith("step_00000008")
    assert_close_runs(straight(kind_a, n_a), out)
    state = json.loads((tmp_path / "moved" / "final" / "state.json").read_text())
    history = [[0, n_a]] + ([[8, n_b]] if n_b != n_a else [])
    assert state["progress"]["world_sizes"] == history and state["world_size"] == n_b


def test_fsdp_shards_the_optimizer_state(straight):
    """Each rank writes about half of AdamW's moments: the bytes of optimizer state in each rank's
    DCP file, read from the checkpoint's own index."""
    from torch.distributed.checkpoint import FileSystemReader

    fsdp = straight("fsdp", 2)
    path, _ = Rolling(fsdp / "checkpoints", 2).latest_valid()
    index = FileSystemReader(str(path / "dcp")).read_metadata().storage_data
    per_file: dict[str, int] = {}
    for key, info in index.items():
        if key.fqn.startswith("optimizer.state."):
            per_file[info.relative_path] = per_file.get(info.relative_path, 0) + info.length
    total = sum(per_file.values())
    assert sorted(per_file) == ["__0_0.distcp", "__1_0.distcp"]
    for size in per_file.values():
        assert 0.4 < size / total < 0.6, per_file
    # ...and together they are the whole state a DDP rank holds on its own (each stored shard and
    # AdamW step counter also carries a serialisation header of its own).
    whole = torch.load(fsdp / "final" / "optimizer.pt", weights_only=True)["optimizer"]["state"]
    moments = sum(t.numel() * t.element_size() for s in whole.values() for k, t in s.items() if k != "step")
    assert 0.95 < total / moments < 1.25, (total, moments)


def test_fsdp_on_one_process_is_one_shard(straight):
    one = straight("fsdp", 1)
    assert json.loads((one / "final" / "state.json").read_text())["progress"]["step"] == 16
    assert_close_runs(one, straight("ddp", 1), exact=True)


def test_a_kill_during_an_async_save_leaves_the_previous_checkpoint_valid(tiny_config, tmp_path, straight):
    """A real SIGKILL while a save is in flight: the staging folder is cleared at the next start,
    the newest committed checkpoint verifies, and the run resumes from it to the same weights as
    the uninterrupted run with synchronous saves (an async save changes no number)."""
    cfg = dict(parallel="fsdp", async_save=True, **BASE)
    job, killed = tmp_path / "job.json", tiny_config(out_dir=str(tmp_path / "killed"), **cfg)
    proc = detached.start(killed, job, 2, faults.env(slow_checkpoint=3))
    checkpoints = tmp_path / "killed" / "checkpoints"
    detached.wait_until((checkpoints / "step_00000004" / "state.json").is_file, 120)
    # step 4 is committed once step 8's save is asked for; step 8's shards are then in flight.
    detached.wait_until(lambda: any(checkpoints.glob(".tmp-step_00000008-*")), 60)
    detached.kill(proc, tmp_path / "killed")
    path, _ = Rolling(checkpoints, 2).latest_valid()
    assert path.name == "step_00000004"
    summary = launch.run(tiny_config(out_dir=str(tmp_path / "killed"), **cfg), Launch(nproc_per_node=2))
    assert summary["resumed_from"].endswith("step_00000004")
    assert not list(checkpoints.glob(".tmp-*"))
    assert_close_runs(straight("fsdp", 2), tmp_path / "killed", exact=True)


def test_two_nodes_on_one_machine_train_and_resume(tiny_config, tmp_path, straight):
    """Two launchers with nnodes=2 rendezvous on 127.0.0.1, one gloo worker each: an FSDP run
    stopped part way and resumed gives the one-machine run's training."""
    launcher = (
        "import json, sys; from lehr.engine.processes.launch import Launch, run; "
        "from lehr.engine.config import TrainConfig; run(TrainConfig(**json.load(open(sys.argv[1]))), "
        "Launch(nproc_per_node=1, nnodes=2, node_rank=int(sys.argv[2]), "
        "rdzv_endpoint='127.0.0.1:' + sys.argv[3]))"
    )

    def two_nodes(**overrides) -> None:
        job = tmp_path / "job.json"
        cfg = tiny_config(out_dir=str(tmp_path / "two-nodes"), parallel="fsdp", **BASE, **overrides)
        job.write_text(json.dumps(cfg.to_dict()))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        nodes = [
            # Two nodes on one machine share its cores: declared, each launcher claims half of them.
            subprocess.Popen(
                [sys.executable, "-c", launcher, str(job), str(r), port],
                start_new_session=True,
                env={**os.environ, "LEHR_JOBS": "2"},
            )
            for r in (0, 1)
        ]
        try:
            assert [n.wait(timeout=300) for n in nodes] == [0, 0]
        finally:
            for n in nodes:
                if n.poll() is None:
                    os.killpg(n.pid, signal.SIGKILL)

    two_nodes(end_step=8)
    two_nodes()
    state = json.loads((tmp_path / "two-nodes" / "final" / "state.json").read_text())
    assert state["world_size"] == 2 and state["progress"]["step"] == 16
    assert_close_runs(straight("fsdp", 2), tmp_path / "two-nodes", exact=True)
