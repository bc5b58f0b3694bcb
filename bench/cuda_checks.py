"""The engine's checks on a CUDA device, on synthetic shards, with nothing but the engine's own
dependencies (GPU images rarely hold Kedro): the CPU test suite's claims, seen on a GPU.

- host syncs: CUDA's sync debug mode counts the synchronizing operations between two log steps
  (goal: only the read at the log step, from the loop's sync point);
- exact resume: 30 steps straight vs 13, stop, resume to 30 -> every weight and optimizer tensor
  equal (deterministic algorithms and the math attention kernel, so the GPU itself adds no noise);
- non-finite guard: a NaN step is skipped inside fused AdamW (its step count stays behind by one),
  and three in a row abort.

    PYTHONPATH=src python bench/cuda_checks.py      (needs a CUDA device; exit 1 on a failed check)
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file

from lehr.engine.artifacts import checkpoint
from lehr.engine.config import TrainConfig
from lehr.engine.model import preset
from lehr.engine.run import loop
from lehr.engine.run.loop import train
from lehr.engine.run.stopping import DivergedError
from synthetic import synthetic_shards

# The tests' fault injection (a NaN loss at chosen steps), from outside the engine's code.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.injected.sitecustomize import poison_steps  # noqa: E402

EVENTS: list = []
RESULTS: list[tuple[bool, str]] = []


def marker():
    """Engine callback factory: marks each log step in the event stream."""
    return lambda recs: EVENTS.extend(("log", rec["step"]) for rec in recs if rec["kind"] == "train")


def check(ok: bool, what: str) -> None:
    RESULTS.append((ok, what))
    print(f"{'PASS' if ok else 'FAIL'}  {what}", flush=True)


def config(shards: Path, out: Path, **overrides) -> TrainConfig:
    base = dict(
        model=preset("cpu-demo", 4096),
        shards=str(shards),
        out_dir=str(out),
        seed=0,
        data_seed=1,
        batch_size=16,
        micro_batch=8,
        stable_mix={"gold": 1.0, "silver": 1.0},
        planned_steps=30,
        warmup_steps=5,
        eval_every=10**9,
        ckpt_every=10**9,
        log_every=10,
        eval_windows=1,
        sample_tokens=0,
        device="cuda",
        precision="bf16",
        compile=False,  # eager, as the checks first passed; bench/gpu.sh times compiled runs
    )
    return TrainConfig(**{**base, **overrides})


def host_syncs(shards: Path, tmp: Path) -> None:
    def record(message, category, filename, lineno, file=None, line=None):
        where = [f for f in traceback.extract_stack()[:-1] if "/lehr/" in f.filename]
        EVENTS.append(
            ("sync", f"{where[-1].filename.rsplit('/lehr/', 1)[1]}:{where[-1].lineno}" if where else "?")
        )

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train(config(shards, tmp / "syncs"), ["__main__:marker"])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    logs = [i for i, e in enumerate(EVENTS) if e[0] == "log"]
    for a, b in zip(logs, logs[1:], strict=False):
        sites = collections.Counter(e[1] for e in EVENTS[a + 1 : b] if e[0] == "sync")
        outside = [s for s in sites if not s.startswith("engine/run/loop.py")]
        check(
            not outside and sum(sites.values()) <= 2,
            f"host syncs, steps {EVENTS[a][1]}..{EVENTS[b][1]}: {sum(sites.values())} synchronizing CUDA "
            f"operation(s), at {dict(sites)} (goal: the log step's read only)",
        )


def exact_resume(shards: Path, tmp: Path) -> None:
    torch.use_deterministic_algorithms(True)
    try:
        run = dict(anneal_start=20, anneal_steps=10, attention="math")
        train(config(shards, tmp / "straight", **run))
        train(config(shards, tmp / "resumed", end_step=13, **run))
        resumed = train(config(shards, tmp / "resumed", **run))
    finally:
        torch.use_deterministic_algorithms(False)
    a, b = (
        load_file(tmp / "straight/final/model.safetensors"),
        load_file(tmp / "resumed/final/model.safetensors"),
    )
    oa = checkpoint.load_optimizer(tmp / "straight/final", torch.device("cpu"))["optimizer"]["state"]
    ob = checkpoint.load_optimizer(tmp / "resumed/final", torch.device("cpu"))["optimizer"]["state"]
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    differ += [f"optimizer {i}.{k}" for i in oa for k in oa[i] if not torch.equal(oa[i][k], ob[i][k])]
    check(
        resumed["mode"] == "resume" and not differ,
        f"exact resume on CUDA (13 + 17 steps == 30): {len(differ)} tensor(s) differ {differ[:3]}",
    )


def non_finite_guard(shards: Path, tmp: Path) -> None:
    train_step = loop.Run.train_step
    poison_steps(loop, {7})
    try:
        summary = train(config(shards, tmp / "nan", planned_steps=12))
        steps = {
            float(s["step"])
            for s in checkpoint.load_optimizer(Path(summary["final"]), torch.device("cpu"))["optimizer"][
                "state"
            ].values()
        }
        check(
            summary["skips_total"] == 1 and steps == {11.0},
            f"a NaN step is skipped on the device: skips {summary['skips_total']}, AdamW steps {steps} "
            f"(want {{11.0}})",
        )
        loop.Run.train_step = train_step
        poison_steps(loop, set(range(12, 20)))
        try:
            train(config(shards, tmp / "diverge", planned_steps=30, max_consecutive_skips=3))
            check(False, "three NaN steps in a row abort: the run did not abort")
        except DivergedError as e:
            check(
                "consecutive non-finite steps" in str(e),
                f"three NaN steps in a row abort (at the next sync point): {e}",
            )
    finally:
        loop.Run.train_step = train_step


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("bench/cuda_checks.py needs a CUDA device")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, for exact resume
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shards = synthetic_shards(tmp / "shards", 4096)
        for run_check in (host_syncs, exact_resume, non_finite_guard):
            try:
                run_check(shards, tmp)
            except Exception as e:  # a check that crashes is a failed check; the others still run
                check(False, f"{run_check.__name__} crashed: {type(e).__name__}: {str(e)[:500]}")
    failed = [what for ok, what in RESULTS if not ok]
    print(f"{len(RESULTS) - len(failed)} of {len(RESULTS)} checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
