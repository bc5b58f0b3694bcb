"""The stable phase keeps a checkpoint at each branch point, for good, and a run stopped between
two of them resumes to the same bytes at every one."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from lehr.engine.artifacts import checkpoint
from lehr.engine.config import StopRule
from lehr.engine.run.loop import train

STOPPED: list[int] = []


def stop_at_step_9():
    """Engine callback factory: a SIGTERM to this process once the log passes step 9, as an
    operator's ``kill`` would send (the loop finishes its step, checkpoints and exits)."""

    def see(records: list[dict]) -> None:
        if not STOPPED and any(r.get("step", 0) >= 9 for r in records):
            STOPPED.append(1)
            os.kill(os.getpid(), signal.SIGTERM)

    return see


def _rule(run: Path, keep: tuple[int, ...] = (6, 12)) -> StopRule:
    return StopRule(
        planned_step=20,
        min_step=20,
        max_step=20,
        auto=False,
        stall_window=2,
        stall_eps=0.0,
        save_to=str(run / "pre_anneal"),
        keep=keep,
        keep_to=str(run / "branch_points"),
    )


def test_branch_points_are_kept_whole_and_a_stopped_run_resumes_to_the_same_bytes(tiny_config, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    common = dict(ckpt_every=5, log_every=3, eval_every=10)
    straight = train(tiny_config(out_dir=str(a), stop_rule=_rule(a), **common))
    names = {"tokens-3072", "tokens-6144"}  # steps 6 and 12 of 8 x 64 tokens
    assert set(straight["branch_points"]) == names and straight["step"] == 20

    STOPPED.clear()
    stopped = train(tiny_config(out_dir=str(b), stop_rule=_rule(b), **common), [f"{__name__}:stop_at_step_9"])
    assert stopped["stopped"] == "signal" and set(stopped["branch_points"]) == {"tokens-3072"}
    assert not (b / "pre_anneal").exists()
    resumed = train(tiny_config(out_dir=str(b), stop_rule=_rule(b), **common))
    assert resumed["mode"] == "resume" and set(resumed["branch_points"]) == names

    for name in ("branch_points/tokens-3072", "branch_points/tokens-6144", "pre_anneal"):
        ours, theirs = checkpoint.verify(a / name), checkpoint.verify(b / name)
        assert ours["progress"]["step"] == theirs["progress"]["step"]
        assert ours["progress"]["tokens"] == theirs["progress"]["tokens"]
        for f in ("model.safetensors", "optimizer.pt", "rng_rank0.pt"):
            assert (a / name / f).read_bytes() == (b / name / f).read_bytes(), (name, f)
    # Rolling checkpoints come and go (keep_last); the branch points stay.
    assert {p.name for p in (b / "branch_points").iterdir()} == names


def test_a_branch_point_added_after_the_run_passed_it_is_refused(tiny_config, tmp_path):
    """Its weights are gone: the run says so before any work instead of finishing without it."""
    common = dict(ckpt_every=5, log_every=5, eval_every=10)
    train(tiny_config(out_dir=str(tmp_path), stop_rule=_rule(tmp_path), **common))
    with pytest.raises(
        ValueError, match=r"resumed at step 20, past the branch point\(s\) tokens-1536, which it"
    ):
        train(tiny_config(out_dir=str(tmp_path), stop_rule=_rule(tmp_path, keep=(3, 6, 12)), **common))


def test_a_branch_point_inside_a_batch_size_warmup_is_named_by_the_tokens_it_trained(tiny_config, tmp_path):
    """Steps 0-2 draw 2 sequences, 3-5 4, 6-7 6, then 8: step 3 ends 6 x 64 tokens in, step 12
    62 x 64; every log record counts the tokens drawn, and its rate the step it covers."""
    ramp = dict(batch_warmup_steps=8, batch_warmup_start=2, ckpt_every=5, log_every=1, eval_every=10)
    cfg = tiny_config(out_dir=str(tmp_path), stop_rule=_rule(tmp_path, keep=(3, 12)), **ramp)
    summary = train(cfg)
    assert set(summary["branch_points"]) == {"tokens-384", "tokens-3968"}
    for name in summary["branch_points"]:
        tokens = checkpoint.verify(tmp_path / "branch_points" / name)["progress"]["tokens"]
        assert tokens == int(name.removeprefix("tokens-"))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in steps] == list(range(1, 21))
    timing = [json.loads(line) for line in (tmp_path / "timing.jsonl").read_text().splitlines()]
    clocks = {r["step"]: r for r in timing if r["kind"] == "train"}
    for r in steps:
        assert r["tokens"] == cfg.batch_ramp.rows_before(r["step"]) * 64
        clock = clocks.get(r["step"], r)
        assert clock["tok_per_s"] * clock["seconds"] == pytest.approx(cfg.batch_ramp.rows(r["step"] - 1) * 64)
