"""GPU check: where lehr's loop makes the CUDA stream wait for the host, counted per log interval.

The loop is meant to sync once per log step (loss, grad norm and skip counts in one read). CUDA's
sync debug mode warns on every synchronizing operation, Python-level or not (``.item()``, pageable
copies, ``nonzero``...); this prints how many fell between two log steps and where they came from.

    python bench/syncs.py          (needs a CUDA device)
"""

from __future__ import annotations

import sys

sys.path.append(sys.path.pop(0))  # bench/tokenize.py must not shadow the stdlib module

import collections  # noqa: E402
import logging  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from synthetic import synthetic_shards  # noqa: E402

from lehr.engine.config import TrainConfig  # noqa: E402
from lehr.engine.loop import train  # noqa: E402
from lehr.engine.model import preset  # noqa: E402

EVENTS: list = []


def marker():
    """Engine callback factory: marks each log step in the event stream."""
    return lambda rec: EVENTS.append(("log", rec["step"])) if rec["kind"] == "train" else None


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("bench/syncs.py needs a CUDA device")
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        shards = synthetic_shards(Path(tmp) / "shards", 4096)
        cfg = TrainConfig(model=preset("cpu-demo", 4096), shards=str(shards), out_dir=f"{tmp}/run", seed=0, data_seed=1,
                          batch_size=16, micro_batch=8, stable_mix={"gold": 1.0, "silver": 1.0}, total_steps=30,
                          warmup_steps=5, eval_every=10**9, ckpt_every=10**9, log_every=10, eval_windows=1,
                          sample_tokens=0, device="cuda", precision="bf16")

        def record(message, category, filename, lineno, file=None, line=None):
            where = [f for f in traceback.extract_stack()[:-1] if "/lehr/" in f.filename]
            EVENTS.append(("sync", f"{where[-1].filename.rsplit('/lehr/', 1)[1]}:{where[-1].lineno}" if where else "?"))

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            try:
                train(cfg, ["__main__:marker"])
            finally:
                torch.cuda.set_sync_debug_mode("default")
    logs = [i for i, e in enumerate(EVENTS) if e[0] == "log"]
    for a, b in zip(logs, logs[1:]):
        sites = collections.Counter(e[1] for e in EVENTS[a + 1:b] if e[0] == "sync")
        steps = EVENTS[b][1] - EVENTS[a][1]
        print(f"steps {EVENTS[a][1]}..{EVENTS[b][1]}: {sum(sites.values())} synchronizing CUDA operations in "
              f"{steps} steps (goal: 1) at {dict(sites)}")


if __name__ == "__main__":
    main()
