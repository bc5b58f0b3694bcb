"""The machine-wide allocator of devices (lehr.engine.processes.shares): disjoint shares for runs side by
side, a wait for a share that is held, and a claim that ends with its holder however it dies.
A machine of 4 GPUs is simulated (the allocator over 4 named devices); the holders are real
processes, one killed with SIGKILL."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lehr.engine.processes import shares

HOLDER = """
import json, sys, time
from lehr.engine.processes import shares
gpus, cores, nproc = sys.argv[1], sys.argv[2], int(sys.argv[3])
machine = shares.Machine(tuple(int(c) for c in cores.split(",") if c), tuple(g for g in gpus.split(",") if g))
with shares.claim(nproc, bool(machine.gpus), "test holder", machine, poll_s=0.05) as share:
    print(json.dumps(share.tags()), flush=True)
    time.sleep(600)
"""


@pytest.fixture
def allocator(tmp_path, monkeypatch):
    monkeypatch.setenv(shares.FOLDER_ENV, str(tmp_path / "shares"))
    monkeypatch.delenv(shares.JOBS_ENV, raising=False)
    procs = []

    def start(
        gpus: str = "", cores: str = "0,1", nproc: int = 1, jobs: str | None = None
    ) -> subprocess.Popen:
        env = {**os.environ, **({shares.JOBS_ENV: jobs} if jobs else {})}
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, gpus, cores, str(nproc)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def claimed(proc: subprocess.Popen, timeout: float = 30) -> dict:
    line = _readline(proc, timeout)
    assert line, f"no share within {timeout} s: {proc.stderr.read() if proc.poll() is not None else ''}"
    return json.loads(line)


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    return proc.stdout.readline() if sel.select(timeout) else ""


FOUR_GPUS = "0,1,2,3"


def test_two_gpu_runs_get_disjoint_gpus_and_a_third_waits_until_one_is_killed(allocator):
    a, b = allocator(FOUR_GPUS, nproc=2), allocator(FOUR_GPUS, nproc=2)
    got_a, got_b = claimed(a), claimed(b)
    gpus_a, gpus_b = set(got_a["gpus"].split(",")), set(got_b["gpus"].split(","))
    assert len(gpus_a) == len(gpus_b) == 2 and not gpus_a & gpus_b
    assert got_a["cores"] == got_b["cores"] == ""  # undeclared GPU runs leave the cores as they are

    third = allocator(FOUR_GPUS, nproc=2)
    assert _readline(third, 2.0) == "", "a third 2-GPU run got GPUs while four were held"
    assert all(
        h["purpose"] == "test holder"
        for h in shares.holders(shares.Machine((), ("0", "1", "2", "3"))).values()
    )
    os.kill(a.pid, signal.SIGKILL)  # no cleanup runs: the kernel ends the claim
    got = claimed(third)
    assert set(got["gpus"].split(",")) == gpus_a


def test_a_third_gpu_run_goes_on_when_one_ends_normally(allocator):
    a = allocator(FOUR_GPUS, nproc=3)
    claimed(a)
    b = allocator(FOUR_GPUS, nproc=1)
    gpu_b = claimed(b)["gpus"]
    c = allocator(FOUR_GPUS, nproc=1)
    assert _readline(c, 1.0) == ""
    b.terminate()  # SIGTERM: Python's default ends it at once
    b.wait()
    assert claimed(c)["gpus"] == gpu_b


def test_declared_jobs_split_the_cores_and_undeclared_runs_take_them_all(allocator):
    one, two = allocator(cores="0,1", jobs="2"), allocator(cores="0,1", jobs="2")
    assert sorted([claimed(one)["cores"], claimed(two)["cores"]]) == ["0", "1"]
    for proc in (one, two):
        proc.kill()
        proc.wait()
    whole = allocator(cores="0,1")
    assert claimed(whole)["cores"] == "0-1"
    second = allocator(cores="0,1")
    assert _readline(second, 1.0) == ""  # waits for the first
    whole.kill()
    assert claimed(second)["cores"] == "0-1"


def test_a_waiting_run_says_once_what_it_waits_for_and_how_to_declare(allocator, caplog, monkeypatch):
    holder = allocator(cores="0,1")
    claimed(holder)
    machine = shares.Machine((0, 1))
    caplog.set_level(logging.INFO, "lehr.engine.processes.shares")

    def end_holder():
        time.sleep(0.5)
        holder.kill()

    import threading

    threading.Thread(target=end_holder).start()
    with shares.claim(1, False, "waiter", machine, poll_s=0.05) as share:
        assert share.cores == (0, 1) and share.whole
    waits = [r.message for r in caplog.records if r.message.startswith("waiting for")]
    assert len(waits) == 1
    assert f"pid {holder.pid}" in waits[0] and "test holder" in waits[0]
    assert "lehr queue start -j N" in waits[0] and shares.JOBS_ENV in waits[0]


def test_more_processes_than_the_machine_gives_are_refused_before_any_wait(tmp_path, monkeypatch):
    monkeypatch.setenv(shares.FOLDER_ENV, str(tmp_path))
    with (
        pytest.raises(ValueError, match="nproc_per_node = 3.*2 GPU"),
        shares.claim(3, True, "x", shares.Machine((0,), ("0", "1"))),
    ):
        pass
    monkeypatch.setenv(shares.JOBS_ENV, "zero")
    with pytest.raises(ValueError, match="LEHR_JOBS='zero'"):
        shares.jobs()


def test_a_share_sets_its_processes_gpus_threads_and_affinity(tmp_path, monkeypatch):
    monkeypatch.setenv(shares.FOLDER_ENV, str(tmp_path))
    monkeypatch.setenv(shares.JOBS_ENV, "2")
    machine = shares.Machine((0, 1, 2, 3), ("4", "5", "6", "7"))
    with shares.claim(2, True, "x", machine) as first, shares.claim(2, True, "y", machine) as second:
        assert first.gpus == ("4", "5") and second.gpus == ("6", "7")
        assert (first.first_gpu_index, second.first_gpu_index) == (0, 2)
        assert first.cores == (0, 1) and second.cores == (2, 3)
        assert second.env(2) == {"CUDA_VISIBLE_DEVICES": "6,7", "OMP_NUM_THREADS": "1"}
        assert second.describe().endswith("GPU 6,7 + cores 2-3")
    import torch

    here = tuple(sorted(os.sched_getaffinity(0)))
    if len(here) < 2:
        pytest.skip("pinning to part of the cores needs two of them")
    monkeypatch.setenv(shares.JOBS_ENV, str(len(here)))
    before = torch.get_num_threads()
    with shares.claim(1, False, "z", shares.Machine(here)) as share, shares.pinned(share, 1):
        assert os.sched_getaffinity(0) == set(share.cores) and len(share.cores) == 1
        assert torch.get_num_threads() == 1
    assert tuple(sorted(os.sched_getaffinity(0))) == here and torch.get_num_threads() == before


def test_torchrun_workers_get_their_shares_gpus_and_threads(tiny_config, tmp_path, monkeypatch):
    """What the launcher hands torchrun: the share's CUDA_VISIBLE_DEVICES and thread count win over
    the launcher's own default of one thread (the command itself is only recorded here)."""
    from lehr.engine.config import Launch
    from lehr.engine.processes import launch

    seen = {}

    def recorded(cmd, env, preexec_fn):
        seen.update(env)
        Path(cmd[-1]).write_text(json.dumps({"stopped": None}))  # the summary rank 0 would write
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(launch.subprocess, "run", recorded)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    share = shares.Share("h", (0, 1, 2, 3), ("6", "7"), whole=False, first_gpu_index=2)
    cfg = tiny_config()
    launch._torchrun(cfg, Launch(nproc_per_node=2), [], share.env(2), tmp_path / "run")
    assert seen["CUDA_VISIBLE_DEVICES"] == "6,7" and seen["OMP_NUM_THREADS"] == "2"
    launch._torchrun(cfg, Launch(nproc_per_node=2), [], {}, tmp_path / "run")
    assert seen["OMP_NUM_THREADS"] == "1"  # no share's word: one thread per worker, as before
