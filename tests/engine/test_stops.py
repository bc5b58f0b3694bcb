"""The loop's stops, for real: SIGINT and SIGHUP act like SIGTERM (a checkpoint of the very step,
then an exact resume); an exception inside an eval after a checkpoint loses nothing; under DDP a
signal to one rank stops both at the same step, and a divergence aborts both with the last
checkpoint intact."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from lehr.engine.artifacts.checkpoint import Rolling, verify
from lehr.engine.processes.launch import Launch, run
from lehr.engine.run import loop
from lehr.engine.run.loop import train
from tests import faults
from tests.engine.test_resume import assert_same_final

SEND = {}  # what the callback below sends to this process, and after which logged step


def send_signal():
    def callback(records):
        if any(r["kind"] == "train" and r["step"] == SEND["after"] for r in records):
            os.kill(os.getpid(), SEND["signal"])

    return callback


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_sigint_and_sighup_checkpoint_the_step_and_resume_exactly(tiny_config, tmp_path, caplog, sig):
    run_ = dict(planned_steps=30, ckpt_every=1000, eval_every=1000)
    train(tiny_config(out_dir=str(tmp_path / "straight"), **run_))
    SEND.update(signal=sig, after=10)
    stopped = train(tiny_config(out_dir=str(tmp_path / "stopped"), **run_), [f"{__name__}:send_signal"])
    # Noticed at the next step's agreement point: that step is finished, checkpointed, and the run ends.
    assert stopped["stopped"] == "signal" and stopped["step"] == 11
    assert f"{sig.name} received" in caplog.text
    assert (tmp_path / "stopped" / "checkpoints" / "latest").read_text().strip() == "step_00000011"
    resumed = train(tiny_config(out_dir=str(tmp_path / "stopped"), **run_))
    assert resumed["mode"] == "resume" and resumed["step"] == 30
    assert_same_final(tmp_path / "straight", tmp_path / "stopped")


def test_an_exception_inside_eval_after_a_checkpoint_loses_nothing(tiny_config, tmp_path, monkeypatch):
    run_ = dict(planned_steps=30, ckpt_every=10, eval_every=10)
    train(tiny_config(out_dir=str(tmp_path / "straight"), **run_))
    real, calls = loop.evaluate, []

    def breaks_the_second_time(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the eval of step 20, after step 10's checkpoint
            raise RuntimeError("the eval broke")
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", breaks_the_second_time)
    cfg = tiny_config(out_dir=str(tmp_path / "run"), **run_)
    with pytest.raises(RuntimeError, match="the eval broke"):
        train(cfg)
    path, state = Rolling(tmp_path / "run" / "checkpoints", 2).latest_valid()
    assert state["progress"]["step"] == 10 and verify(path)
    monkeypatch.setattr(loop, "evaluate", real)
    resumed = train(cfg)
    assert resumed["mode"] == "resume" and resumed["step"] == 30
    assert_same_final(tmp_path / "straight", tmp_path / "run")


def _workers() -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if "lehr.engine.processes.worker" in p.cmdline() and "torch.distributed.run" not in p.cmdline()
    ]


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_both_at_the_same_step(tiny_config, tmp_path):
    cfg = tiny_config(
        out_dir=str(tmp_path / "run"), planned_steps=5000, micro_batch=2, ckpt_every=10_000, eval_every=10_000
    )
    summary: dict = {}
    launcher = threading.Thread(target=lambda: summary.update(run(cfg, Launch(nproc_per_node=2))))
    launcher.start()
    metrics, deadline = tmp_path / "run" / "metrics.jsonl", time.time() + 120
    while time.time() < deadline and not (metrics.is_file() and metrics.read_text().count("\n") >= 3):
        time.sleep(0.05)
    rank1 = next(p for p in _workers() if p.environ().get("RANK") == "1")
    rank1.send_signal(signal.SIGTERM)  # rank 1 only; rank 0 hears of it at the next step's agreement
    launcher.join(timeout=300)
    assert summary["stopped"] == "signal" and 0 < summary["step"] < 5000
    latest = (
        tmp_path / "run" / "checkpoints" / (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    )
    assert latest.name == f"step_{summary['step']:08d}"
    # Both ranks handed their RNG state to that one checkpoint: they stopped at the same step.
    assert (latest / "rng_rank0.pt").is_file() and (latest / "rng_rank1.pt").is_file()


@pytest.mark.slow
def test_a_divergence_under_ddp_aborts_both_ranks_and_keeps_the_last_checkpoint(
    tiny_config, tmp_path, monkeypatch, capfd
):
    cfg = tiny_config(
        out_dir=str(tmp_path / "run"),
        planned_steps=30,
        micro_batch=2,
        ckpt_every=10,
        eval_every=1000,
        max_consecutive_skips=3,
    )
    with pytest.raises(RuntimeError, match="torchrun exited with code"):
        # every rank's loss turns NaN on these steps
        run(cfg, Launch(nproc_per_node=2), extra_env=faults.env(nonfinite_steps="12,13,14"))
    assert capfd.readouterr().err.count("3 consecutive non-finite steps (by step 15)") >= 2  # both ranks
    path, state = Rolling(tmp_path / "run" / "checkpoints", 2).latest_valid()
    assert state["progress"]["step"] == 10 and state["world_size"] == 2 and verify(path)
    assert not _workers()
