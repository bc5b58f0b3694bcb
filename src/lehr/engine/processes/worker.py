"""Entry point of each process torchrun launches: ``python -m lehr.engine.processes.worker JOB SUMMARY``.

JOB is a JSON file ``{"config": ..., "callbacks": [...]}``; rank 0 writes its summary to SUMMARY.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from lehr.engine.config import TrainConfig
from lehr.engine.processes.launch import die_with_parent
from lehr.engine.run.loop import train


def main() -> int:
    # torchrun starts each worker in a session of its own, out of reach of a signal to the stage's
    # process group; dying with the torchrun agent (which dies with the stage) leaves no orphan
    # training on into the run folder.
    die_with_parent()
    if os.getppid() == 1:  # the agent died before the line above
        return 1
    job_path, summary_path = sys.argv[1], sys.argv[2]
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    job = json.loads(Path(job_path).read_text())
    summary = train(TrainConfig(**job["config"]), job["callbacks"])
    if rank == 0:
        Path(summary_path).write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
