"""Exact resume: K steps straight == K/2 steps, stop, resume to K, in every tensor and the curve."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lehr.engine.run.loop import train
from lehr.engine.run.metrics import CLOCK_KEYS


def tensors(run: Path) -> tuple[dict, dict]:
    weights = load_file(run / "final" / "model.safetensors")
    opt = torch.load(run / "final" / "optimizer.pt", weights_only=True)
    return weights, opt


def assert_same_final(a: Path, b: Path) -> None:
    (wa, oa), (wb, ob) = tensors(a), tensors(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    for i, state in oa["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, ob["optimizer"]["state"][i][key]), (i, key)
    assert oa["scaler"] == ob["scaler"]
    ra, rb = (torch.load(run / "final" / "rng_rank0.pt", weights_only=True) for run in (a, b))
    assert ra["python"] == rb["python"] and torch.equal(ra["torch"], rb["torch"])
    assert all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(ra["numpy"], rb["numpy"], strict=True)
    )


def train_curve(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r["kind"] == "train" and r["step"] % 5 == 0]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])  # bf16: the default on CPUs that have it
def test_in_process_stop_and_resume_is_exact(tiny_config, tmp_path, precision):
    run = dict(anneal_start=20, anneal_steps=20, precision=precision)
    straight = train(tiny_config(out_dir=str(tmp_path / "a"), **run))
    train(tiny_config(out_dir=str(tmp_path / "b"), end_step=17, **run))
    resumed = train(tiny_config(out_dir=str(tmp_path / "b"), **run))
    assert resumed["mode"] == "resume" and resumed["resumed_from"].endswith("step_00000017")
    assert straight["step"] == resumed["step"] == 40
    assert_same_final(tmp_path / "a", tmp_path / "b")
    assert train_curve(tmp_path / "a") == train_curve(tmp_path / "b")


SEEN: list[dict] = []


def collector():
    """Engine callback factory, named as ``tests.engine.test_resume:collector``."""
    return SEEN.extend


def test_a_resumed_run_hands_its_callbacks_the_whole_history(tiny_config, tmp_path):
    run = dict(out_dir=str(tmp_path / "run"), planned_steps=30)
    train(tiny_config(**run, end_step=17))
    SEEN.clear()
    train(tiny_config(**run), [f"{__name__}:collector"])
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # Callbacks get the clock's readings too (MLflow's tok/s); the run folder keeps them apart.
    assert [{k: v for k, v in r.items() if k not in CLOCK_KEYS} for r in SEEN] == history
    assert all(r["tok_per_s"] > 0 for r in SEEN if r["kind"] == "train")
    assert [r["step"] for r in SEEN if r["kind"] == "train"] == [5, 10, 15, 17, 20, 25, 30]


def test_sigterm_checkpoints_within_a_step_and_resumes_exactly(tiny_config, tmp_path):
    cfg_path = tmp_path / "job.json"
    straight = tmp_path / "straight"
    # 80 steps: the signal comes after step 20 (4 log lines), and the run must still be going then.
    train(tiny_config(out_dir=str(straight), planned_steps=80, ckpt_every=1000, eval_every=1000))
    job = {
        "config": tiny_config(
            out_dir=str(tmp_path / "killed"), planned_steps=80, ckpt_every=1000, eval_every=1000
        ).to_dict(),
        "callbacks": [],
    }
    cfg_path.write_text(json.dumps(job))
    proc = subprocess.Popen(
        [sys.executable, "-m", "lehr.engine.processes.worker", str(cfg_path), str(tmp_path / "s.json")],
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 120  # a loaded machine (make test's workers beside it) starts it slowly
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 4):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.05)
    assert time.time() < deadline, "the run logged no 4 steps in 120 s: no signal sent"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["stopped"] == "signal" and 0 < summary["step"] < 80
    assert "SIGTERM received" in err
    latest = (tmp_path / "killed" / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{summary['step']:08d}"  # the checkpoint is of the very step it stopped at
    resumed = train(
        tiny_config(out_dir=str(tmp_path / "killed"), planned_steps=80, ckpt_every=1000, eval_every=1000)
    )
    assert resumed["mode"] == "resume" and resumed["step"] == 80
    assert_same_final(straight, tmp_path / "killed")


def test_resume_under_changed_math_is_refused_naming_keys(tiny_config, tmp_path):
    from lehr.engine.artifacts.checkpoint import CheckpointError

    train(tiny_config(end_step=10))
    with pytest.raises(CheckpointError, match=r"another configuration \(lr, weight_decay differ\)"):
        train(tiny_config(lr=1e-2, weight_decay=0.0))
    # Fields that do not change the math may change: the step budget, the log interval.
    summary = train(tiny_config(planned_steps=20, log_every=2))
    assert summary["mode"] == "resume" and summary["step"] == 20


def test_branch_from_an_initial_checkpoint(tiny_config, tmp_path):
    train(tiny_config(out_dir=str(tmp_path / "base"), planned_steps=20))
    start = tmp_path / "base" / "final"
    branch = dict(init_from=str(start), data_seed=5, anneal_start=20, anneal_steps=10, end_step=30)
    s = train(tiny_config(out_dir=str(tmp_path / "branch"), **branch))
    assert s["mode"] == "branch" and s["step"] == 30
    again = train(tiny_config(out_dir=str(tmp_path / "branch"), **branch))
    assert again["mode"] == "resume"  # its own folder wins over the initial checkpoint
    assert os.path.isdir(tmp_path / "branch" / "best")
