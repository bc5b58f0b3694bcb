"""An engine run started in a process group of its own, so that a test can SIGKILL all of it
(launcher, torchrun and workers) as an operator's kill would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from lehr.engine.config import TrainConfig

LAUNCHER = (
    "import json, sys; from lehr.engine.processes.launch import Launch, run; from lehr.engine.config import "
    "TrainConfig; run(TrainConfig(**json.load(open(sys.argv[1]))), Launch(nproc_per_node=int(sys.argv[2])))"
)


def start(cfg: TrainConfig, job: Path, processes: int, env: dict[str, str]) -> subprocess.Popen:
    job.write_text(json.dumps(cfg.to_dict()))
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(job), str(processes)],
        env={**os.environ, **env},
        start_new_session=True,
    )


def wait_until(done, seconds: float) -> None:
    """Poll ``done()`` until it holds or ``seconds`` pass (the caller then kills, whichever)."""
    deadline = time.time() + seconds
    while time.time() < deadline and not done():
        time.sleep(0.1)


def kill(proc: subprocess.Popen, run_dir: Path, seconds: float = 30) -> None:
    """SIGKILL the run's process group, as an operator's kill -9 would, and return once every
    process of the run is gone: torchrun's workers, in sessions of their own, die with the agent
    (a parent-death signal) a moment after it, and a test must not read the folder before."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + seconds
    while time.time() < deadline and _of_run(run_dir):
        time.sleep(0.05)
    assert not _of_run(run_dir), f"left behind after the kill: {_of_run(run_dir)}"


def _of_run(run_dir: Path) -> list[int]:
    """The processes whose command line names the run folder (the workers' job files lie in it)."""
    found, inside = [], str(run_dir) + os.sep  # not a sibling folder that shares the name's start
    for p in psutil.process_iter():
        try:
            if inside in " ".join(p.cmdline()):
                found.append(p.pid)
        except psutil.Error:
            continue
    return found
