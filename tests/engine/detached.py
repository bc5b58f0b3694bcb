"""An engine run started in a process group of its own, so that a test can SIGKILL all of it
(launcher, torchrun and workers) as an operator's kill would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from lehr.engine.config import TrainConfig

LAUNCHER = (
    "import json, sys; from lehr.engine.dist.launch import Launch, run; from lehr.engine.config import "
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
