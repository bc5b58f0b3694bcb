"""Benchmark: lehr's training loop vs a bare forward/backward/step loop, side by side.

Same model, batch, precision and optimizer; the bare loop gets its batches pre-drawn in memory.
Prints tokens/s of each and their ratio (goal >= 0.97x), the data stream's share of step time
(goal <= 1%), and checkpoint save / verify+load seconds. Where no peak is known for the device (a
CPU), its ceiling is measured in the same run: the FLOP/s the loop achieved (the engine's FLOPs per
token x tok/s) against a large square matmul's FLOP/s (``--matmul-size``) in bf16 and fp32.

With ``--processes N`` (torchrun, gloo on CPU: DDP, or FSDP with ``--parallel fsdp``), instead
lehr's N-process tok/s with Muon's orthogonalisation shared against redundant
(``pretrain.muon_work``), interleaved rounds, ending with ``shared / redundant: N.NNx`` (goal
>= 1.1x on a 2-core CPU).

    python bench/train_loop.py [--optimizer adamw]               # CPU, cpu-demo preset
    python bench/train_loop.py --no-compile                      # eager (compiled is the default)
    python bench/train_loop.py --preset gpt2-small --device cuda --precision bf16
    python bench/train_loop.py --processes 2 [--parallel fsdp]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lehr.engine import fp8
from lehr.engine.artifacts import checkpoint
from lehr.engine.batches import ShardSet, TrainStream
from lehr.engine.config import TrainConfig
from lehr.engine.hardware import resolve
from lehr.engine.model import Transformer, preset
from lehr.engine.optim import build as build_optimizer
from lehr.engine.optim.muon_work import MUON_WORK
from lehr.engine.processes.launch import Launch, run
from lehr.engine.run.loop import train
from synthetic import synthetic_shards

MIX = {"gold": 1.0, "silver": 1.0}
MATMUL_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def speed_config(model, shards: Path, out: Path, *, batch: int, micro: int, warmup: int, steps: int, **hw):
    """A run that only trains: evals and checkpoints off, a log window every ``warmup`` steps
    (the first is the warm-up), ``hw`` the hardware and optimizer settings under test."""
    return TrainConfig(
        model=model,
        shards=str(shards),
        out_dir=str(out),
        seed=0,
        data_seed=1,
        batch_size=batch,
        micro_batch=micro,
        stable_mix=MIX,
        planned_steps=warmup + steps,
        warmup_steps=10,
        eval_every=10**9,
        ckpt_every=10**9,
        log_every=warmup,
        eval_windows=1,
        sample_tokens=0,
        task_examples=0,
        **hw,
    )


def config(args, shards: Path, out: Path, **settings) -> TrainConfig:
    model = preset(args.preset, args.vocab, **({"seq_len": args.seq_len} if args.seq_len else {}))
    return speed_config(
        model,
        shards,
        out,
        batch=args.batch,
        micro=args.micro,
        warmup=args.warmup,
        steps=args.steps,
        precision=args.precision,
        device=args.device,
        compile=args.compile,
        attention=args.attention,
        parallel=args.parallel,
        activation_checkpointing=args.activation_checkpointing,
        optimizer=args.optimizer,
        **settings,
    )


RECORDS: list[dict] = []


def collector():
    """Engine callback factory (passed by its module and name): keeps every record."""
    return RECORDS.extend


def lehr_tok_s(cfg: TrainConfig) -> tuple[float, float | None, str]:
    """tokens/s over the steps after warm-up (the first log window), from the windows the loop
    itself measures and logs: all their tokens over all their seconds."""
    RECORDS.clear()
    train(cfg, [f"{__name__}:collector"])  # this module, run or imported
    logged = [r for r in RECORDS if r["kind"] == "train"]
    tokens = [b["tokens"] - a["tokens"] for a, b in zip(logged, logged[1:], strict=False)]
    seconds = sum(n / r["tok_per_s"] for n, r in zip(tokens, logged[1:], strict=True))
    return sum(tokens) / seconds, logged[-1]["mfu"], logged[-1]["mem"]


def matmul_flops(dtype: torch.dtype, device: torch.device, size: int = 1024, seconds: float = 1.0) -> float:
    """FLOP/s of ``size`` x ``size`` matmuls in ``dtype``, repeated for about ``seconds`` after one
    warm-up: what this device's kernels reach on a large square matmul (bf16 is emulated where the
    CPU has no bf16 instructions, and this measures that too)."""
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    reps, t0 = 0, time.perf_counter()
    while reps < 2 or time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 2 * size**3 * reps / (time.perf_counter() - t0)


def logged_tok_s(run_dir: Path) -> float:
    """``lehr_tok_s`` from a run's metrics.jsonl and timing.jsonl, for runs in other processes
    (torchrun's)."""
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    times = map(json.loads, (run_dir / "timing.jsonl").read_text().splitlines())
    clock = {r["step"]: r for r in times if r["kind"] == "train"}
    logged = [{**r, **clock[r["step"]]} for r in rows if r["kind"] == "train"]
    tokens = [b["tokens"] - a["tokens"] for a, b in zip(logged, logged[1:], strict=False)]
    return sum(tokens) / sum(n / r["tok_per_s"] for n, r in zip(tokens, logged[1:], strict=True))


def across_processes(args, shards: Path, tmp: Path) -> None:
    """Muon's shared against redundant orthogonalisation in lehr's own N-process runs."""
    tok_s: dict[str, list[float]] = {work: [] for work in MUON_WORK}
    for r in range(args.rounds):  # interleaved, each first in every other round
        for work in MUON_WORK if r % 2 == 0 else MUON_WORK[::-1]:
            cfg = config(args, shards, tmp / f"{work}{r}", muon_work=work)
            run(cfg, Launch(nproc_per_node=args.processes))
            tok_s[work].append(logged_tok_s(Path(cfg.out_dir)))
    print(
        f"model {args.preset}, batch {args.batch} x {cfg.model.seq_len} tokens, micro {args.micro}, "
        f"{args.processes} processes ({cfg.parallel}, {cfg.device}), optimizer {cfg.optimizer}"
    )
    for work, values in tok_s.items():
        rounds = ", ".join(f"{x:,.0f}" for x in values)
        print(f"muon_work {work:9s} {statistics.median(values):10,.0f} tok/s   (rounds: {rounds})")
    ratio = statistics.median(tok_s["shared"]) / statistics.median(tok_s["redundant"])
    print(f"shared / redundant: {ratio:.2f}x   (goal >= 1.1x)")


def bare_tok_s(cfg: TrainConfig, warmup: int, steps: int) -> float:
    hw = resolve(cfg.device, cfg.precision, None, attention=cfg.attention)
    torch.manual_seed(0)
    model = Transformer(cfg.model).to(hw.device)
    if hw.precision == "fp8":
        fp8.convert(model)
    opt = build_optimizer(model, cfg)
    fwd = torch.compile(model) if cfg.compile else model
    stream = TrainStream(
        ShardSet(cfg.shards, cfg.model.vocab_size, cfg.model.seq_len, verify=False), cfg.model.seq_len, 1
    )
    batches = [stream.next_batches(cfg.batch_size, MIX, 0, 1, cfg.micro_batch, hw.device) for _ in range(8)]
    accum = cfg.batch_size // cfg.micro_batch
    for i in range(warmup + steps):
        if i == warmup:
            if hw.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        for x, y in batches[i % len(batches)]:
            with hw.compute():
                _, loss = fwd(x, y)
            (loss / accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if hw.device.type == "cuda":
        torch.cuda.synchronize()
    return steps * cfg.batch_size * cfg.model.seq_len / (time.perf_counter() - t0)


def data_share(cfg: TrainConfig, step_seconds: float) -> float:
    stream = TrainStream(
        ShardSet(cfg.shards, cfg.model.vocab_size, cfg.model.seq_len, verify=False), cfg.model.seq_len, 1
    )
    device = resolve(cfg.device, cfg.precision, None, attention=cfg.attention).device
    t0 = time.perf_counter()
    for _ in range(20):
        stream.next_batches(cfg.batch_size, MIX, 0, 1, cfg.micro_batch, device)
    return (time.perf_counter() - t0) / 20 / step_seconds


def checkpoint_seconds(cfg: TrainConfig, out: Path) -> tuple[float, float]:
    model = Transformer(cfg.model)
    opt = build_optimizer(model, cfg)
    model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long))[1].backward()
    opt.step()
    t0 = time.perf_counter()
    path = checkpoint.write(
        out / "ckpt",
        model=model,
        optimizer_state={"optimizer": opt.state_dict(), "scaler": {}},
        state={"progress": {}},
        rng_per_rank=[checkpoint.rng_state()],
    )
    saved = time.perf_counter() - t0
    t0 = time.perf_counter()
    checkpoint.verify(path)
    checkpoint.load_weights(path, model)
    opt.load_state_dict(checkpoint.load_optimizer(path, torch.device("cpu"))["optimizer"])
    return saved, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cpu-demo")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=0)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--attention", default="auto", help="SDPA kernel: auto | flash | efficient | cudnn | math")
    p.add_argument("--parallel", default="ddp", help="ddp | fsdp (FSDP2; over one process: one shard)")
    p.add_argument("--processes", type=int, default=1, help="> 1: shared vs redundant Muon across them")
    p.add_argument("--matmul-size", type=int, default=1024, help="the square matmul of a CPU's ceiling")
    p.add_argument("--activation-checkpointing", default="none", help="none | blocks")
    p.add_argument(
        "--optimizer", default="muon", help="adamw | muon (Muon on the hidden matrices, AdamW on the rest)"
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shards = synthetic_shards(tmp / "shards", args.vocab)
        if args.processes > 1:
            across_processes(args, shards, tmp)
            return
        ours, bare = [], []
        # Interleaved, so drift in machine speed hits both alike, and each goes first in every other
        # round: on this 2-core CPU whichever runs second in a round measured up to ~10% faster.
        for r in range(args.rounds):
            for which in ("lehr", "bare") if r % 2 == 0 else ("bare", "lehr"):
                if which == "lehr":
                    tok_s, mfu, mem = lehr_tok_s(config(args, shards, tmp / f"run{r}"))
                    ours.append(tok_s)
                else:
                    bare.append(bare_tok_s(config(args, shards, tmp / "bare"), args.warmup, args.steps))
        cfg = config(args, shards, tmp / "x")
        lehr_med, bare_med = statistics.median(ours), statistics.median(bare)
        step_s = cfg.batch_size * cfg.model.seq_len / lehr_med
        save_s, load_s = checkpoint_seconds(cfg, tmp)
        model = Transformer(cfg.model)
        n_params = model.num_parameters()
        hw = resolve(cfg.device, cfg.precision, None, attention=cfg.attention)
        print(
            f"model {args.preset} ({n_params / 1e6:.1f}M params), batch {cfg.batch_size} x "
            f"{cfg.model.seq_len} tokens, "
            f"micro {cfg.micro_batch}, device {hw.name}, precision {hw.precision}, compile {cfg.compile}, "
            f"attention {hw.attention}, parallel {cfg.parallel}, activation checkpointing "
            f"{cfg.activation_checkpointing}, optimizer {cfg.optimizer}"
        )
        print(f"lehr loop     {lehr_med:12,.0f} tok/s   (rounds: {', '.join(f'{x:,.0f}' for x in ours)})")
        print(f"bare loop     {bare_med:12,.0f} tok/s   (rounds: {', '.join(f'{x:,.0f}' for x in bare)})")
        print(f"ratio lehr/bare  {lehr_med / bare_med:.3f}x   (goal >= 0.97x)")
        print(
            "MFU           "
            f"{'n/a (no peak TFLOPS known for this device)' if mfu is None else f'{mfu:.1%}'}; memory {mem}"
        )
        if mfu is None:  # no known peak: this device's own ceiling, measured now
            achieved = model.flops_per_token() * lehr_med
            size = args.matmul_size
            ceiling = {name: matmul_flops(dtype, hw.device, size) for name, dtype in MATMUL_DTYPES.items()}
            # A CPU run is bf16 or fp32 (fp8 there is an emulation for tests, timed against fp32).
            run_dtype = "bf16" if hw.precision == "bf16" else "fp32"
            print(
                f"FLOP/s        achieved {achieved / 1e9:,.1f} G (FLOPs per token x tok/s) = "
                f"{achieved / ceiling[run_dtype]:.1%} of this device's {run_dtype} matmul "
                f"({ceiling[run_dtype] / 1e9:,.1f} G, the run's precision); matmul bf16 "
                f"{ceiling['bf16'] / 1e9:,.1f} G, fp32 {ceiling['fp32'] / 1e9:,.1f} G"
            )
        print(f"data stream   {data_share(cfg, step_s):.2%} of step time   (goal <= 1%)")
        print(f"checkpoint    save {save_s:.2f} s, verify + load {load_s:.2f} s")


if __name__ == "__main__":
    main()
