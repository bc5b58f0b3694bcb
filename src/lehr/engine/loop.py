"""The training loop: one function that trains a ``TrainConfig`` from wherever it should start.

Step order: set LR -> micro-batches (autocast forward, scaled loss, backward; DDP ``no_sync`` on all
but the last) -> unscale, clip -> fused AdamW step, which skips itself on a non-finite grad norm ->
zero grad -> log / eval / checkpoint at intervals. Loss, grad norm and skip counts stay on the
device; the host reads them once per sync point (a log, eval or checkpoint step, or the end).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch.nn.parallel import DistributedDataParallel as DDP

from lehr.engine import checkpoint, distributed, fp8
from lehr.engine.config import TrainConfig, math_diff
from lehr.engine.data import ShardSet, TrainStream, manifest_sha256
from lehr.engine.evaluation import HeldOut, evaluate, sample_text, stalled
from lehr.engine.guard import NonFiniteGuard
from lehr.engine.hardware import memory_report, resolve
from lehr.engine.metrics import RunLog, load_callbacks
from lehr.engine.model import Transformer
from lehr.engine.schedule import lr_at
from lehr.engine.signals import GracefulStop

FAULT_ENV = "LEHR_FAULT_NONFINITE_STEPS"  # test-only: comma-separated steps whose loss becomes NaN
EXIT_DIVERGED = 3


class DivergedError(RuntimeError):
    """Too many non-finite steps in a row; the last good checkpoint was left untouched."""


@dataclass
class Progress:
    """Everything besides tensors that a resumed run must restore; saved in state.json."""

    step: int = 0
    tokens: int = 0
    anneal_start: int | None = None  # stable phase: the decided start of the decay
    anneal_reason: str | None = None
    evals: list = field(default_factory=list)  # [{"step", "heldout.loss", ...}]
    best_loss: float | None = None
    skips_total: int = 0


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    # Decay matrices only: norm gains are not capacity, and decaying them distorts normalisation.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # Fused on every device: one kernel per step, and it honours ``found_inf`` (see guard.py).
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True)


def anneal_mix(cfg: TrainConfig, step: int, anneal_start: int | None) -> dict[str, float]:
    if anneal_start is None or step < anneal_start or not cfg.anneal_mix:
        return cfg.stable_mix
    frac = (step - anneal_start) / max(1, cfg.anneal_steps)
    for end_fraction, weights in cfg.anneal_mix:
        if frac < end_fraction:
            return weights
    return cfg.anneal_mix[-1][1]


def train(cfg: TrainConfig, callback_specs: list[str] = ()) -> dict:
    d = distributed.setup(cfg.device)
    try:
        return _train(cfg, d, load_callbacks(list(callback_specs)) if d.is_main else [])
    finally:
        distributed.teardown(d)


def _train(cfg: TrainConfig, d: distributed.Dist, callbacks: list) -> dict:
    hw = resolve(cfg.device, cfg.precision, cfg.peak_tflops, d.local_rank, cfg.attention)
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = ShardSet(cfg.shards, cfg.model.vocab_size, cfg.model.seq_len)
    data_hash = manifest_sha256(cfg.shards)
    checkpoint.seed_all(cfg.seed)
    model = Transformer(cfg.model).to(hw.device)
    fp8_layers = fp8.convert(model) if hw.precision == "fp8" else 0
    optimizer = build_optimizer(model, cfg)
    scaler = hw.grad_scaler()
    stream = TrainStream(shards, cfg.model.seq_len, cfg.data_seed)
    rolling = checkpoint.Rolling(out_dir / "checkpoints", cfg.keep_last)
    prog = Progress()
    if d.is_main:
        rolling.recover()
    distributed.barrier(d)  # every rank then reads the same checkpoints

    mode, path, state = checkpoint.resolve_start(rolling, cfg.init_from)
    if mode == "resume":
        if state.get("world_size", 1) != d.world:
            # Exact resume holds for the process count that made the checkpoint; resharding across
            # counts needs sharded (FSDP/DCP) checkpoints.
            raise checkpoint.CheckpointError(
                f"refusing to resume {path}: it was made by {state.get('world_size', 1)} process(es) and this run "
                f"has {d.world}. Resume with the same count (pretrain.launch.nproc_per_node x nnodes = "
                f"{state.get('world_size', 1)}), or delete {out_dir} to start this run afresh."
            )
        if state["tokenizer_sha256"] != shards.manifest["tokenizer"]["sha256"]:
            raise checkpoint.CheckpointError(
                f"refusing to resume {path}: it was trained on shards of another tokenizer than {cfg.shards}. "
                f"Restore those shards (`dvc checkout`), or delete {out_dir} to start this run afresh."
            )
        if state["math_hash"] != cfg.math_hash():
            keys = math_diff(state["config_math"], cfg.math_fields())
            raise checkpoint.CheckpointError(
                f"refusing to resume {path}: it was made under another configuration ({', '.join(keys)} "
                f"differ). Restore those values, or delete {out_dir} to start this run afresh."
            )
        _restore(path, model, optimizer, scaler, hw.device, d.rank, with_optimizer=True)
        stream.load_state_dict(state["data"])
        prog = Progress(**state["progress"])
    elif mode == "branch":
        _check_branchable(path, state, cfg, shards)
        _restore(path, model, optimizer, scaler, hw.device, d.rank, with_optimizer=cfg.init_optimizer)
        checkpoint.seed_all(cfg.seed + state["progress"]["step"])  # fresh randomness for the branch
        prog = Progress(step=state["progress"]["step"], tokens=state["progress"]["tokens"])
        stream.load_state_dict({"data_seed": cfg.data_seed, "step": prog.step})
    rule = cfg.stop_rule
    if rule and prog.anneal_start is None and not rule.auto:
        prog.anneal_start, prog.anneal_reason = rule.planned_step, "planned"
    anneal_start = cfg.anneal_start if rule is None else prog.anneal_start

    def end_step() -> int:
        if rule:
            return prog.anneal_start if prog.anneal_start is not None else rule.max_step
        return cfg.end_step if cfg.end_step is not None else cfg.total_steps

    accum = cfg.grad_accum(d.world)
    log = RunLog(out_dir, d.is_main, prog.step, end_step(), callbacks)
    n_params = model.num_parameters()
    log.info("%s run at step %d: %.2fM parameters, %d x %d tokens per step, %d process(es), %s %s",
             mode, prog.step, n_params / 1e6, cfg.batch_size, cfg.model.seq_len, d.world, hw.name, hw.precision)
    if mode == "resume":
        log.info("resumed from checkpoint %s", path)
    elif mode == "branch":
        log.info("branched from %s (optimizer state %s)", path, "kept" if cfg.init_optimizer else "fresh")
    if d.is_main:
        _report_epochs(log, stream.tokens_per_tier(range(0, end_step()), cfg.batch_size,
                                                   lambda s: anneal_mix(cfg, s, anneal_start)),
                       f"planned to step {end_step()}", cfg.max_epochs_warn)
    if fp8_layers:
        log.info("fp8: %d linear layers run their matmuls in FP8%s", fp8_layers,
                 "" if hw.device.type == "cuda" else " (emulated on CPU: for tests, not for speed)")

    core = model
    if d.enabled:
        model = DDP(model, device_ids=[hw.device.index] if hw.device.type == "cuda" else None)
    forward = torch.compile(model) if cfg.compile else model
    held = HeldOut.build(shards.heldout(), cfg.model.seq_len, cfg.eval_windows)
    tokenizer = Tokenizer.from_file(str(Path(cfg.shards) / "tokenizer.json")) if cfg.sample_tokens else None
    faults = {int(s) for s in os.environ.get(FAULT_ENV, "").split(",") if s.strip()}
    flops_per_step = core.flops_per_token() * cfg.batch_size * cfg.model.seq_len

    def save(target: Path | None = None) -> Path:
        """Rolling checkpoint (or one at ``target``); every rank hands its RNG state to rank 0."""
        rngs = distributed.gather_to_main(checkpoint.rng_state(), d)
        saved = None
        if d.is_main:
            st = {"progress": vars(prog), "data": stream.state_dict(), "config": cfg.to_dict(),
                  "config_math": cfg.math_fields(), "math_hash": cfg.math_hash(), "manifest_sha256": data_hash,
                  "tokenizer_sha256": shards.manifest["tokenizer"]["sha256"], "world_size": d.world,
                  "torch": torch.__version__, "cuda": torch.version.cuda, "device": hw.name,
                  "provenance": cfg.provenance}
            kw = dict(model=core, optimizer_state={"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()},
                      state=st, rng_per_rank=rngs)
            saved = checkpoint.write(target, **kw) if target else rolling.save(prog.step, **kw)
        distributed.barrier(d)
        return saved

    def run_eval() -> None:
        """Rank 0 evaluates; every rank then holds the same eval history, so the decisions that
        follow (auto-anneal, early stop, best) are taken identically everywhere without more syncs."""
        rec = None
        if d.is_main:
            rec = {"step": prog.step, "kind": "eval", **evaluate(core, held, hw, cfg.micro_batch)}
            if tokenizer is not None:
                rec["sample"] = sample_text(core, tokenizer, cfg.sample_prompt, cfg.sample_tokens, hw.device)
            log.record(rec)
            log.info("eval step %d | heldout loss %.4f | bpb %.4f | ppl %.2f | sample %r", prog.step,
                     rec["heldout.loss"], rec["heldout.bpb"], rec["heldout.ppl"], rec.get("sample", "")[:80])
        rec = distributed.broadcast_object(rec, d)
        prog.evals.append({k: v for k, v in rec.items() if k != "sample"})
        if prog.best_loss is None or rec["heldout.loss"] < prog.best_loss:
            prog.best_loss = rec["heldout.loss"]
            if rule is None:  # anneal runs keep their best weights; the stable phase hands on pre_anneal
                save(out_dir / "best")

    stop_reason, guard = None, NonFiniteGuard(hw.device)
    t_last, steps_since_log = time.perf_counter(), 0
    with GracefulStop() as signals:
        while prog.step < end_step():
            step = prog.step
            lr = lr_at(step, kind=cfg.schedule, lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps,
                       total_steps=cfg.total_steps, anneal_start=anneal_start, anneal_steps=cfg.anneal_steps,
                       shape=cfg.decay_shape)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batches = stream.next_batches(cfg.batch_size, anneal_mix(cfg, step, anneal_start), d.rank, d.world,
                                          cfg.micro_batch, hw.device)
            step_loss = torch.zeros((), device=hw.device)  # stays on the device until a sync point
            try:
                for i, (x, y) in enumerate(batches):
                    sync = model.no_sync() if d.enabled and i < len(batches) - 1 else contextlib.nullcontext()
                    with sync:
                        with hw.compute():
                            _, loss = forward(x, y)
                        if step in faults:
                            loss = loss * float("nan")
                        # Divide so the accumulated gradient is that of one batch of batch_size sequences.
                        scaler.scale(loss / accum).backward()
                    step_loss += loss.detach() / accum
            except torch.OutOfMemoryError as e:
                raise RuntimeError(
                    f"out of GPU memory at step {step} ({memory_report(hw.device)}). Lower micro_batch "
                    f"(now {cfg.micro_batch}; accumulation keeps batch_size), model.seq_len, or the model size."
                ) from e
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(core.parameters(), cfg.grad_clip or float("inf"))
            found_inf = guard.observe(grad_norm)
            if not scaler.is_enabled():  # fp16: the scaler hands the optimizer its own found_inf
                optimizer.found_inf = found_inf
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            prog.step += 1
            prog.tokens += cfg.batch_size * cfg.model.seq_len
            steps_since_log += 1

            stopping = distributed.any_rank(signals.requested is not None, d)
            is_log = prog.step % cfg.log_every == 0
            if (is_log or prog.step % cfg.eval_every == 0 or prog.step % cfg.ckpt_every == 0 or stopping
                    or prog.step >= end_step()):
                if hw.device.type == "cuda":
                    torch.cuda.synchronize()  # the sync point: timings below are of finished work
                # Each rank holds the loss of its share of the batch; the logged loss is the batch's.
                loss_v, norm_v, skipped, longest = torch.stack(
                    [distributed.mean_over_ranks(step_loss, d), grad_norm, *guard.counts()]).tolist()
                guard.reset_window()
                if skipped:
                    prog.skips_total += int(skipped)
                    log.info("%d update(s) skipped for a non-finite grad norm by step %d (longest run %d, "
                             "%d in all)", skipped, prog.step, longest, prog.skips_total)
                    # fp16 overflows are routine: the scaler lowers its scale and carries on.
                    if longest >= cfg.max_consecutive_skips and hw.precision != "fp16":
                        log.close()
                        raise DivergedError(
                            f"{int(longest)} consecutive non-finite steps (by step {prog.step}): the run diverged. "
                            f"The last good checkpoint in {rolling.root} is untouched; resume with a lower lr."
                        )
                if is_log or prog.step >= end_step():
                    dt = time.perf_counter() - t_last
                    tok_s = steps_since_log * cfg.batch_size * cfg.model.seq_len / dt
                    mfu = (flops_per_step * steps_since_log / dt / (hw.peak_tflops * 1e12 * d.world)
                           if hw.peak_tflops else None)
                    # The loss of this step alone (not a window mean), so a resumed run logs the same curve.
                    log.step({"step": prog.step, "kind": "train", "loss": loss_v, "lr": lr, "grad_norm": norm_v,
                              "tok_per_s": tok_s, "mfu": mfu, "tokens": prog.tokens, "mem": memory_report(hw.device)})
                    t_last, steps_since_log = time.perf_counter(), 0

            if prog.step % cfg.eval_every == 0:
                run_eval()
                losses = [e["heldout.loss"] for e in prog.evals]
                if (rule and rule.auto and prog.anneal_start is None and prog.step >= rule.min_step
                        and stalled(losses, rule.stall_window, rule.stall_eps)):
                    prog.anneal_start, prog.anneal_reason = prog.step, "stall"
                    log.info("auto-anneal: held-out loss stalled; the anneal starts at step %d "
                             "(planned %d, bounds %d..%d)", prog.step, rule.planned_step, rule.min_step, rule.max_step)
                if cfg.patience and prog.step >= cfg.patience_from_step:
                    since = [e for e in prog.evals if e["step"] >= cfg.patience_from_step]
                    best_at = min(range(len(since)), key=lambda i: since[i]["heldout.loss"])
                    if len(since) - 1 - best_at >= cfg.patience:
                        stop_reason = "early_stop"
                        log.info("early stop: no held-out improvement in %d evals; best at step %d",
                                 cfg.patience, since[best_at]["step"])
                t_last = time.perf_counter()
            if rule and prog.anneal_start is None and prog.step >= rule.max_step:
                prog.anneal_start, prog.anneal_reason = rule.max_step, "cap"
            if prog.step % cfg.ckpt_every == 0:
                save()
                t_last = time.perf_counter()
            if stopping:
                stop_reason = "signal"
            if stop_reason:
                break

    if stop_reason != "signal" and (not prog.evals or prog.evals[-1]["step"] != prog.step):
        run_eval()
    save()
    summary = {"rank": d.rank, "out_dir": str(out_dir), "step": prog.step, "tokens": prog.tokens, "stopped": stop_reason,
               "resumed_from": str(path) if mode == "resume" else None, "mode": mode,
               "anneal_start": prog.anneal_start, "anneal_reason": prog.anneal_reason,
               "skips_total": prog.skips_total, "n_params": n_params,
               "heldout": prog.evals[-1] if prog.evals else None, "best_loss": prog.best_loss,
               "tiers": stream.tokens_per_tier(range(0, prog.step), cfg.batch_size,
                                               lambda s: anneal_mix(cfg, s, prog.anneal_start if rule else anneal_start))}
    if d.is_main:
        _report_epochs(log, summary["tiers"], f"drawn by step {prog.step}", None)
    if stop_reason == "signal":
        log.info("stopped by %s at step %d; checkpoint saved, resume by running again", signals.requested, prog.step)
    elif rule and prog.step == prog.anneal_start:
        summary["pre_anneal"] = str(save(Path(rule.save_to)))
        log.info("pre_anneal saved at step %d (%s)", prog.step, prog.anneal_reason)
    else:
        summary["final"] = str(save(out_dir / "final"))
    log.close()
    return summary


def _report_epochs(log: RunLog, tiers: dict[str, dict], when: str, warn_above: float | None) -> None:
    """One line of tokens and epochs per tier; a warning for a tier repeated more than ``warn_above`` times."""
    log.info("data, %s: %s", when, "; ".join(
        f"{t} {v['tokens'] / 1e6:.2f}M tokens = {v['epochs']:.2f} epochs of {v['tier_tokens'] / 1e6:.2f}M"
        for t, v in tiers.items()))
    over = {t: v["epochs"] for t, v in tiers.items() if warn_above is not None and v["epochs"] > warn_above}
    if over:
        log.warning("tier(s) %s would be repeated more than pretrain.max_epochs_warn = %g times (%s): "
                    "repeated data gives less with each epoch; add data to the tier, lower its weight, or "
                    "train fewer steps", ", ".join(over), warn_above,
                    ", ".join(f"{t} {e:.1f} epochs" for t, e in over.items()))


def _restore(path: Path, model, optimizer, scaler, device, rank: int, with_optimizer: bool) -> None:
    checkpoint.load_weights(path, model)
    if with_optimizer:
        opt_state = checkpoint.load_optimizer(path, device)
        optimizer.load_state_dict(opt_state["optimizer"])
        scaler.load_state_dict(opt_state["scaler"])
    rng = checkpoint.load_rng(path, rank)
    if rng is not None:
        checkpoint.set_rng_state(rng)


def _check_branchable(path: Path, state: dict, cfg: TrainConfig, shards: ShardSet) -> None:
    theirs, ours = state["config"]["model"], cfg.to_dict()["model"]
    differ = [f"model.{k}" for k in sorted(ours) if theirs.get(k) != ours[k]]
    if state["tokenizer_sha256"] != shards.manifest["tokenizer"]["sha256"]:
        differ.append("tokenizer")
    if differ:
        raise checkpoint.CheckpointError(
            f"refusing to branch from {path}: it was made with another {', '.join(differ)}. Re-run the "
            f"pretrain-stable stage with the current tokenizer and model config."
        )
