"""Benchmark: the GPU line. An engine-only run of a large preset at a fixed token budget,
under FSDP2 with Muon, evals included: tok/s, MFU and the share of the wall time its evals take.

    python bench/gpu_line.py                                          # llama-350m, llama-1b on the GPU
    python bench/gpu_line.py --presets tiny --device cpu --tokens 8192  # its steps on a CPU

Each preset trains from scratch on the project's shards and built-in tasks (``make run`` builds
them; vocabulary from their tokenizer), for ``--tokens`` tokens in steps of its plan's batch x the
preset's context, in one process: FSDP2 (one rank, one shard), Muon on the hidden matrices, bf16
where the device has it, compiled (the first step timed apart). It evals as the default run does,
every ``--eval-every`` steps (on ``--eval-windows`` windows per source; the default run's: 32):
held-out windows of each source, the tasks' first examples, a sample.

From the run's own timing record it prints, per preset: the steps' tok/s, their MFU (the device's
bf16 peak; on a CPU, of its bf16 matmul measured here), and the shares of the wall time spent in
evals and in compiling (checkpoints are off), with peak GPU memory. Nothing is left behind: runs go
to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from lehr.engine.config import TrainConfig
from lehr.engine.hardware import resolve
from lehr.engine.model import Transformer, preset
from lehr.engine.run.loop import train
from train_loop import MATMUL_DTYPES, RECORDS, matmul_flops

ROOT = Path(__file__).resolve().parents[1]
SHARDS, TASKS = ROOT / "data/04_feature/shards", ROOT / "data/04_feature/tasks"
MIX = {"gold": 1.0, "silver": 1.0}


@dataclass(frozen=True)
class Plan:
    """A preset's step on one GPU of ~80 GB: sequences per step, per forward, and recomputation."""

    batch: int
    micro: int
    activation_checkpointing: str = "none"


# llama-1b's activations at 8 sequences of 2,048 tokens outgrow an 80 GB GPU beside its weights,
# gradients and optimizer state: its blocks recompute in the backward, as bench/gpu.sh runs it.
PLANS = {
    "llama-350m": Plan(batch=32, micro=8),
    "llama-1b": Plan(batch=16, micro=8, activation_checkpointing="blocks"),
}
SMALL = Plan(batch=8, micro=4)  # any other preset: the bench checks' tiny runs


def config(name: str, args, out: Path) -> TrainConfig:
    plan = PLANS.get(name, SMALL)
    vocab = Tokenizer.from_file(str(args.shards / "tokenizer.json")).get_vocab_size()
    model = preset(name, vocab)
    steps = max(1, args.tokens // (plan.batch * model.seq_len))
    return TrainConfig(
        model=model,
        shards=str(args.shards),
        out_dir=str(out),
        batch_size=plan.batch,
        micro_batch=plan.micro,
        stable_mix=MIX,
        planned_steps=steps,
        warmup_steps=max(1, steps // 10),
        log_every=max(1, steps // 10),
        eval_every=args.eval_every,
        ckpt_every=10**9,  # the line times training and evals; checkpoints have their own bench
        eval_windows=args.eval_windows,
        sample_tokens=32,
        task_examples=args.task_examples,
        task_files={p.stem: str(p) for p in sorted(args.tasks.glob("*.jsonl"))},
        device=args.device,
        precision="auto",
        parallel="fsdp",
        optimizer="muon",
        activation_checkpointing=plan.activation_checkpointing,
    )


def line(name: str, args, tmp: Path) -> dict:
    cfg = config(name, args, tmp / name)
    RECORDS.clear()
    hw = resolve(cfg.device, cfg.precision, None)
    if hw.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(hw.device)
    began = time.perf_counter()
    train(cfg, ["train_loop:collector"])  # into train_loop.RECORDS
    wall = time.perf_counter() - began
    seconds: dict[str, float] = {}
    for rec in (Path(cfg.out_dir) / "timing.jsonl").read_text().splitlines():
        r = json.loads(rec)
        seconds[r["kind"]] = seconds.get(r["kind"], 0.0) + (r.get("seconds") or 0.0)
    logged = [r for r in RECORDS if r["kind"] == "train" and r.get("tok_per_s")]
    tokens = sum(r["tok_per_s"] * r["seconds"] for r in logged)
    train_s = sum(r["seconds"] for r in logged)
    mfus = [(r["mfu"], r["seconds"]) for r in logged if r.get("mfu") is not None]
    peak_mem = torch.cuda.max_memory_allocated(hw.device) / 2**30 if hw.device.type == "cuda" else None
    return dict(
        preset=name,
        steps=cfg.planned_steps,
        tokens=cfg.planned_steps * cfg.batch_size * cfg.model.seq_len,
        wall=wall,
        tok_s=tokens / train_s if train_s else 0.0,
        mfu=sum(m * s for m, s in mfus) / sum(s for _, s in mfus) if mfus else None,
        # for a device without a known peak only (building llama-1b on the host to count is slow)
        flops_per_token=Transformer(cfg.model).flops_per_token() if not mfus else None,
        shares={k: seconds.get(k, 0.0) / wall for k in ("eval", "compile", "save")},
        evals=sum(1 for r in RECORDS if r["kind"] == "eval"),
        peak_mem=peak_mem,
        device=hw.name,
        precision=hw.precision,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="llama-350m,llama-1b", help="comma-separated model presets")
    p.add_argument("--tokens", type=int, default=2_097_152, help="training tokens per preset")
    p.add_argument("--eval-every", type=int, default=8, help="steps between evals")
    p.add_argument("--eval-windows", type=int, default=16, help="held-out windows per source")
    p.add_argument("--task-examples", type=int, default=100, help="of each built-in task, per eval")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu")
    p.add_argument("--shards", type=Path, default=SHARDS, help="a shard folder (make run builds this one)")
    p.add_argument("--tasks", type=Path, default=TASKS, help="a folder of task .jsonl files")
    args = p.parse_args()
    if not (args.shards / "manifest.json").is_file():
        print(f"no shards at {args.shards}: run `make run` (or `dvc repro shard`) first, or pass --shards")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.presets.split(","):
            rows.append(line(name, args, Path(tmp)))
    ceiling = None
    if any(r["mfu"] is None for r in rows):  # no known peak (a CPU): its own bf16 matmul, measured now
        ceiling = matmul_flops(MATMUL_DTYPES["bf16"], resolve(args.device, "auto", None).device)
    print()
    for r in rows:
        mfu = (
            f"MFU {r['mfu']:.1%}"
            if r["mfu"] is not None
            else f"{r['tok_s'] * r['flops_per_token'] / ceiling:.1%} of this device's bf16 matmul"
        )
        mem = f", peak memory {r['peak_mem']:.1f} GiB" if r["peak_mem"] is not None else ""
        print(
            f"{r['preset']}: {r['steps']} steps, {r['tokens']:,} tokens in {r['wall']:.1f} s on "
            f"{r['device']} ({r['precision']}, FSDP2, Muon): {r['tok_s']:,.0f} tok/s, {mfu}; "
            f"{r['evals']} evals {r['shares']['eval']:.1%} of the time, compiling "
            f"{r['shares']['compile']:.1%}{mem}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
