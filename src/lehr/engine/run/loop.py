"""The training loop. ``train`` is its outline; the parts it names are the methods of ``Run``.

Loss, grad norm and skip counts stay on the device; the host reads them once per sync point (a
log, eval or checkpoint step, a stop, or the end), so a GPU queue never drains mid-interval.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from lehr.engine import memory, optim
from lehr.engine.artifacts import checkpoint
from lehr.engine.artifacts.run_saves import RunSaves, code_record
from lehr.engine.artifacts.state import is_checkpoint
from lehr.engine.batches import ShardSet
from lehr.engine.config import TrainConfig
from lehr.engine.evals.evaluation import HeldOut, evaluate, sample_text, windows_per_pass
from lehr.engine.evals.tasks import Scorer, Task, evaluate_task, read_task
from lehr.engine.hardware import Hardware, memory_report, resolve
from lehr.engine.processes import distributed, parallel
from lehr.engine.run import plan, tail, update
from lehr.engine.run.guard import StepGuard
from lehr.engine.run.metrics import Callback, RunLog, Throughput, load_callbacks, timing
from lehr.engine.run.signals import GracefulStop
from lehr.engine.run.start import build, start
from lehr.engine.run.stopping import DivergedError, Divergence, Progress, policies
from lehr.engine.schedule import mix_at


def train(cfg: TrainConfig, callback_specs: Sequence[str] = ()) -> dict[str, Any]:
    """Train ``cfg`` from wherever it should start (fresh, resume, branch); returns a summary."""
    dist = distributed.setup(cfg.device, cfg.parallel)
    run = None
    try:
        run = Run(cfg, dist, load_callbacks(list(callback_specs)) if dist.is_main else [])
        if run.finished_before():
            return run.summary_of_finished()
        # A run that had stopped early and was killed before its end was saved stops again.
        stop = run.prog.stopped
        with GracefulStop() as signals:
            while stop is None and run.prog.step < run.end_step():
                result = run.train_step()
                # Every rank learns of a signal to any rank, so all stop after the same step.
                signalled = distributed.any_rank(signals.requested is not None, dist)
                if (
                    signalled
                    or run.prog.step >= run.end_step()
                    or run.due(cfg.log_every, cfg.eval_every, cfg.ckpt_every)
                ):
                    run.sync_point(result)
                if run.due(cfg.eval_every):
                    stop = run.evaluate_and_decide()
                run.after_step()
                if run.due(cfg.ckpt_every):
                    run.save_rolling()
                if signalled:
                    stop = "signal"
        return run.finish(stop, signals.requested)
    finally:
        # DDP's reducer goes first, while the process group has other owners: torch frees a reducer
        # holding the GIL, and a gloo group freed from there waits on a thread that wants the GIL
        # (a worker hung at exit that way).
        del run
        gc.collect()
        distributed.teardown(dist)


class Run:
    """The loop's state: what trains (``trainee``), where the run is (``prog``), the decisions'
    policies, and the parts it hands work to: its record (``log``) and its checkpoints (``saves``).
    Built whole here, from a fresh start, a resume or a branch (``start``)."""

    def __init__(self, cfg: TrainConfig, dist: distributed.Dist, callbacks: list[Callback]) -> None:
        self.cfg, self.dist = cfg, dist
        self.hw = resolve(
            cfg.device, cfg.precision, cfg.peak_tflops, dist.local_rank, cfg.attention, cfg.compile
        )
        # Before any work: a run that cannot fit its GPU's free memory is refused, naming what would fit.
        self.memory = _check_memory(cfg, dist.world, self.hw)
        self.out_dir = Path(cfg.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.shards = ShardSet(cfg.shards, cfg.model.vocab_size, cfg.model.seq_len)
        self.trainee = build(cfg, self.hw, self.shards)
        self.saves = RunSaves(cfg, dist, self.hw, self.trainee, self.shards, self.out_dir)
        self.policies = policies(cfg)
        self.divergence = Divergence(cfg.max_consecutive_skips, self.hw.precision)
        self.guard = StepGuard(self.hw.device, cfg.spike_sigma, cfg.spike_window)
        self.mode, self.started_from, self.prog = self._start()
        self._check_branch_points()
        if self.prog.loss_window:
            self.guard.load_state_dict(self.prog.loss_window)
        for policy in self.policies:
            policy.at_start(self.prog)
        core = self.trainee.model
        self.log = self._open_log(callbacks)
        self._announce()
        # The model a step runs: sharded in place under FSDP, wrapped by DDP otherwise.
        self.model = core if parallel.is_sharded(core) else parallel.replicate(core, self.hw, dist.world)
        self.forward = torch.compile(self.model) if cfg.compile else self.model
        self.first_step_compiles = cfg.compile
        self.held, self.tasks, self.tokenizer = _eval_data(cfg, self.shards)
        self.scorer: Scorer | None = None
        cfg.check_split(dist.world)
        self.log.restart_clock()

    def _start(self) -> tuple[str, Path | None, Progress]:
        """Where the run starts: every rank reads the same checkpoints, once rank 0 has cleared
        what a killed save left behind."""
        if self.dist.is_main:
            self.saves.rolling.recover()
        distributed.barrier(self.dist)
        return start(self.cfg, self.dist, self.hw, self.trainee, self.saves.rolling, self.shards)

    def _open_log(self, callbacks: list[Callback]) -> RunLog:
        peak = self.hw.peak_tflops
        return RunLog(
            self.out_dir,
            self.dist.is_main,
            self.prog.step,
            self.end_step(),
            callbacks,
            Throughput(
                flops_per_token=self.trainee.model.flops_per_token(),
                peak_flops=peak * 1e12 * self.dist.world if peak else None,
            ),
        )

    def _announce(self) -> None:
        cfg, log = self.cfg, self.log
        log.info(
            "%s run at step %d: %.2fM parameters, %d x %d tokens per step, %d process(es), %s %s",
            self.mode,
            self.prog.step,
            self.trainee.model.num_parameters() / 1e6,
            cfg.batch_size,
            cfg.model.seq_len,
            self.dist.world,
            self.hw.name,
            self.hw.precision,
        )
        if ingredients := cfg.model.ingredients + cfg.ingredients:
            log.info("ingredients: %s (docs/recipe.md)", ", ".join(ingredients))
        if cfg.batch_warmup_steps:
            stages = sorted({cfg.batch_ramp.rows(s) for s in range(cfg.batch_warmup_steps)})
            log.info(
                "batch-size warmup: steps 0 to %d draw %s sequences, then %d; %.2fM tokens by step %d",
                cfg.batch_warmup_steps - 1,
                ", ".join(map(str, stages)),
                cfg.batch_size,
                self.tokens_at(self.end_step()) / 1e6,
                self.end_step(),
            )
        per = "GPU" if self.hw.device.type == "cuda" else "process, in RAM"
        log.info(
            "memory estimate (%s, %s): %s",
            cfg.parallel,
            cfg.activation_checkpointing,
            self.memory.describe(per),
        )
        if self.mode == "resume":
            log.info("resumed from checkpoint %s", self.started_from)
        elif self.mode == "branch":
            log.info(
                "branched from %s (optimizer state %s)",
                self.started_from,
                "kept" if cfg.init_optimizer else "fresh",
            )
        self._report_epochs(
            range(0, self.end_step()), f"planned to step {self.end_step()}", cfg.max_epochs_warn
        )
        if self.trainee.fp8_layers:
            log.info(
                "fp8: %d linear layers run their matmuls in FP8%s",
                self.trainee.fp8_layers,
                "" if self.hw.device.type == "cuda" else " (emulated on CPU: for tests, not for speed)",
            )

    def _report_epochs(self, steps: range, when: str, warn_above: float | None) -> None:
        if self.dist.is_main:  # the tiers are counted where they are logged
            tiers = self.trainee.stream.tokens_per_tier(steps, self.cfg.batch_ramp.rows, self.mix)
            self.log.epochs(tiers, when, warn_above)

    def end_checkpoint(self) -> Path:
        """Where the run's end is saved: ``pre_anneal`` for the stable phase, ``final`` otherwise."""
        return Path(self.cfg.stop_rule.save_to) if self.cfg.stop_rule else self.out_dir / "final"

    def finished_before(self) -> bool:
        """The run resumed at its end, and that end's checkpoint is saved and whole: an earlier
        attempt finished it under this code (resume refuses other code) and a plan that ends it
        here (resume refuses another plan that would not: ``run.plan``), so nothing is to train."""
        if self.mode != "resume" or not (self.prog.stopped or self.prog.step >= self.end_step()):
            return False
        try:
            end = checkpoint.verify(self.end_checkpoint())
        except checkpoint.CheckpointError:
            return False  # killed before its end was saved (or it is broken): save it again
        return end["progress"]["step"] == self.prog.step and end.get("code") == code_record()

    def summary_of_finished(self) -> dict[str, Any]:
        self.log.info(
            "%s finished at step %d under this code and configuration: nothing trained, nothing rewritten",
            self.out_dir,
            self.prog.step,
        )
        summary = self._summary(self.prog.stopped)
        summary["pre_anneal" if self.cfg.stop_rule else "final"] = str(self.end_checkpoint())
        self.log.close()
        return summary

    # -- where the run is --------------------------------------------------------------------------
    @property
    def anneal_start(self) -> int | None:
        """The stable phase decides its anneal start as it goes; an anneal branch is given one."""
        return self.prog.anneal_start if self.cfg.stop_rule else self.cfg.anneal_start

    @property
    def decay_end(self) -> int:
        """The step the decay ends at (an anneal branch's end); where tail averaging ends."""
        return (self.anneal_start or 0) + self.cfg.anneal_steps

    def end_step(self) -> int:
        cfg = self.cfg
        if cfg.stop_rule:
            return self.prog.anneal_start if self.prog.anneal_start is not None else cfg.stop_rule.max_step
        return cfg.end_step if cfg.end_step is not None else cfg.planned_steps

    def due(self, *intervals: int) -> bool:
        return any(self.prog.step % every == 0 for every in intervals)

    def mix(self, at: int) -> dict[str, float]:
        cfg = self.cfg
        return mix_at(at, self.anneal_start, cfg.anneal_steps, cfg.stable_mix, cfg.anneal_mix)

    # -- one step ----------------------------------------------------------------------------------
    def train_step(self) -> update.StepResult:
        cfg, trainee, s = self.cfg, self.trainee, self.prog.step
        began = time.perf_counter()
        lr = plan.lr_schedule(cfg, self.anneal_start).lr_at(s)
        optim.set_lr(trainee.optimizer, lr)
        batches = trainee.stream.next_batches(
            cfg.batch_ramp.rows(s),
            self.mix(s),
            self.dist.rank,
            self.dist.world,
            cfg.micro_batch,
            self.hw.device,
        )
        try:
            loss = update.accumulate(
                self.forward, self.model, batches, trainee.scaler, self.hw, z_loss=cfg.z_loss
            )
        except torch.OutOfMemoryError as e:
            raise update.out_of_memory(s, self.hw, cfg.micro_batch) from e
        # Spike skipping compares the batch's loss, so every replica takes the same decision.
        batch_loss = distributed.mean_over_ranks(loss, self.dist) if cfg.spike_sigma else loss
        grad_norm = update.apply(
            trainee.model, trainee.optimizer, trainee.scaler, self.guard, cfg.grad_clip, batch_loss
        )
        self.prog.step += 1
        self.prog.tokens += cfg.batch_ramp.rows(s) * cfg.model.seq_len
        if (
            cfg.tail_steps
            and tail.first_step(self.decay_end, cfg.tail_steps) <= self.prog.step <= self.decay_end
        ):
            tail.add(trainee.model, trainee.optimizer)
        self.log.stepped(cfg.batch_ramp.rows(s) * cfg.model.seq_len)
        if self.first_step_compiles:  # timed apart, as a save is, so that no log window's tok/s holds it
            self.first_step_compiles = False
            if self.hw.device.type == "cuda":
                torch.cuda.synchronize()  # the step's kernels too, not only its compiling
            seconds = time.perf_counter() - began
            self.log.timed(self.prog.step, "compile", seconds)
            self.log.info(
                "step %d compiled the model (torch.compile) and ran in %.1f s; torch's cache keeps "
                "the compiled step for the next run of this shape on this machine",
                self.prog.step,
                seconds,
            )
            self.log.restart_clock()
        return update.StepResult(loss, grad_norm, lr)

    # -- the sync point: the host reads the device, once ---------------------------------------
    def sync_point(self, result: update.StepResult) -> None:
        prog, cfg = self.prog, self.cfg
        if self.hw.device.type == "cuda":
            torch.cuda.synchronize()  # timings below are of finished work
        # Each rank holds the loss of its share of the batch; the logged loss is the batch's.
        loss, norm, skipped, longest, spikes = torch.stack(
            [distributed.mean_over_ranks(result.loss, self.dist), result.grad_norm, *self.guard.counts()]
        ).tolist()
        self.guard.reset_window()
        if spikes:
            prog.spikes_total += int(spikes)
            self.log.info(
                "%d update(s) skipped as loss spikes by step %d (> %g sigma over %d losses; %d in all)",
                spikes,
                prog.step,
                cfg.spike_sigma,
                cfg.spike_window,
                prog.spikes_total,
            )
        if skipped:
            prog.skips_total += int(skipped)
            self.log.info(
                "%d update(s) skipped for a non-finite grad norm by step %d (longest run %d, %d in all)",
                skipped,
                prog.step,
                longest,
                prog.skips_total,
            )
            try:
                self.divergence.check(int(longest), prog.step, str(self.saves.rolling.root))
            except DivergedError:
                self.log.close()
                raise
        if self.due(cfg.log_every) or prog.step >= self.end_step():
            self.log.train_step(prog.step, loss, result.lr, norm, prog.tokens, memory_report(self.hw.device))

    # -- eval and the decisions that follow it ------------------------------------------------------
    def evaluate(self) -> None:
        """Rank 0 evaluates; every rank then holds the same eval history, so the decisions that
        follow (auto-anneal, early stop, best) are taken identically everywhere without more syncs."""
        cfg, prog = self.cfg, self.prog
        rec: dict[str, Any] | None = None
        model = self.saves.whole_model()
        if self.dist.is_main:
            assert model is not None  # rank 0 is handed the whole model
            began = time.perf_counter()
            rec = {
                "step": prog.step,
                "kind": "eval",
                **evaluate(model, self.held, self.hw, cfg.micro_batch),
            }
            if self.tasks:  # the first task_examples of each, so every eval scores the same ones
                # One scorer while the model is the same object, so that each pair is tokenized
                # once a run, not at every eval.
                if self.scorer is None or self.scorer.model is not model:
                    assert self.tokenizer is not None  # loaded for the tasks (_eval_data)
                    rows = windows_per_pass(cfg.model.seq_len, cfg.micro_batch)
                    self.scorer = Scorer(model, self.tokenizer, self.hw.device, rows, remember=True)
                rec["tasks"] = {
                    task.name: evaluate_task(self.scorer, task, cfg.task_examples) for task in self.tasks
                }
            if cfg.sample_tokens:
                assert self.tokenizer is not None  # loaded for the sample (_eval_data)
                rec["sample"] = sample_text(
                    model, self.tokenizer, cfg.sample_prompt, cfg.sample_tokens, self.hw.device
                )
            rec["seconds"] = time.perf_counter() - began
            self.log.record(rec)
            self.log.info(
                "eval step %d | heldout loss %.4f | bpb %.4f | ppl %.2f%s | sample %r",
                prog.step,
                rec["heldout"]["loss"],
                rec["heldout"]["bpb"],
                rec["heldout"]["ppl"],
                "".join(f" | {name} acc {r['acc']:.3f}" for name, r in rec.get("tasks", {}).items()),
                rec.get("sample", "")[:80],
            )
        rec = distributed.broadcast_object(rec, self.dist)
        assert rec is not None  # rank 0's, now on every rank
        prog.evals.append({k: v for k, v in rec.items() if k not in ("sample", "seconds")})
        if prog.best_loss is None or rec["heldout"]["loss"] < prog.best_loss:
            prog.best_loss = rec["heldout"]["loss"]
        # Anneal runs keep their best weights by decide_by; the stable phase hands on pre_anneal.
        if cfg.stop_rule is None and prog.best_at(cfg.decide_by) == len(prog.evals) - 1:
            self.save(self.out_dir / "best")

    def evaluate_and_decide(self) -> str | None:
        self.evaluate()
        reasons = [policy.after_eval(self.prog) for policy in self.policies]
        self.log.restart_clock()
        return next((r for r in reasons if r), None)

    def after_step(self) -> None:
        for policy in self.policies:
            policy.after_step(self.prog)
        if self.cfg.stop_rule and self.prog.step in self.cfg.stop_rule.keep:
            self.save(self.branch_point(self.prog.step))
            self.log.info("branch point %s kept", self.branch_point(self.prog.step).name)

    def branch_point(self, step: int) -> Path:
        """Where the stable phase keeps its checkpoint of ``step`` for good (a branch point)."""
        rule = self.cfg.stop_rule
        assert rule is not None  # branch points are the stable phase's, which has a stop rule
        return Path(rule.keep_to) / rule.kept_name(self.tokens_at(step))

    def tokens_at(self, step: int) -> int:
        """The tokens trained by ``step`` (fewer than step x batch_size within a batch-size warmup)."""
        return self.cfg.batch_ramp.rows_before(step) * self.cfg.model.seq_len

    def _check_branch_points(self) -> None:
        """A run resumed past a branch point it never kept cannot keep it any more (the weights of
        that step are gone): refused before any work, naming the points and what to do."""
        rule = self.cfg.stop_rule
        passed = [
            self.branch_point(s).name
            for s in (rule.keep if rule else ())
            if s <= self.prog.step and not is_checkpoint(self.branch_point(s))
        ]
        if passed:
            raise ValueError(
                f"{self.out_dir} resumed at step {self.prog.step}, past the branch point(s) "
                f"{', '.join(passed)}, which it did not keep (pretrain.branch_points gained them after "
                "the run had trained through them): a branch point is kept as the stable phase trains "
                "through it. Drop them from pretrain.branch_points, or train them in a stable run of "
                "their own (pretrain.run_name=<a new name>)."
            )

    def branch_points(self) -> dict[str, str]:
        """The branch points kept so far, by name (a resumed run finds its earlier attempts')."""
        rule = self.cfg.stop_rule
        kept = [self.branch_point(s) for s in (rule.keep if rule else ()) if s <= self.prog.step]
        return {p.name: str(p) for p in kept if is_checkpoint(p)}

    # -- checkpoints ---------------------------------------------------------------------------------
    def save_rolling(self) -> None:
        self.save()

    def save(self, target: Path | None = None) -> Path | None:
        """A checkpoint (the rolling one, or at ``target``), its seconds in the run's timing record
        and not in the next steps' (the clock restarts)."""
        began = time.perf_counter()
        where = self.saves.save(self.prog, self.guard, target)
        self.log.timed(self.prog.step, "save", time.perf_counter() - began)
        self.log.restart_clock()
        return where

    # -- finish --------------------------------------------------------------------------------------
    def finish(self, stop: str | None, signal_name: str | None) -> dict[str, Any]:
        prog, cfg, log = self.prog, self.cfg, self.log
        # The decay's end, or a policy's early stop; a signal or a stop short of both keeps the sums
        # (the run's next attempt averages and evaluates them).
        ended = stop is not None or prog.step >= self.decay_end
        averaged = stop != "signal" and ended and self._average_tail()
        if stop != "signal" and (averaged or not prog.evals or prog.evals[-1]["step"] != prog.step):
            self.evaluate()
        if stop != "signal":
            prog.stopped = stop  # kept, so that a rerun knows the run ended here
        self.save()
        self._report_epochs(range(0, prog.step), f"drawn by step {prog.step}", None)
        end = {}
        if stop == "signal":
            log.info(
                "stopped by %s at step %d; checkpoint saved, resume by running again", signal_name, prog.step
            )
        elif cfg.stop_rule and prog.step == prog.anneal_start:
            end["pre_anneal"] = str(self.save(self.end_checkpoint()))
            log.info("pre_anneal saved at step %d (%s)", prog.step, prog.anneal_reason)
        else:
            end["final"] = str(self.save(self.end_checkpoint()))
        summary = {**self._summary(stop), **end}  # after the last save: its time is the run's too
        self.saves.wait()
        log.close()
        return summary

    def _average_tail(self) -> bool:
        """The tail's average takes the weights' place (an early stop averages what it reached);
        the final eval then scores it."""
        cfg, trainee = self.cfg, self.trainee
        count = min(self.prog.step, self.decay_end) - tail.first_step(self.decay_end, cfg.tail_steps) + 1
        if not cfg.tail_steps or not tail.average_into_weights(trainee.model, trainee.optimizer, count):
            return False
        self.log.info("tail averaging: the weights of the last %d steps averaged into the final model", count)
        return True

    def _summary(self, stop: str | None) -> dict[str, Any]:
        prog, cfg = self.prog, self.cfg
        # The whole run's, from its record: every attempt's steps and evals, not this process's share.
        wall, tok_s = timing(self.out_dir) if self.dist.is_main else (None, None)
        return {
            "rank": self.dist.rank,
            "out_dir": str(self.out_dir),
            "step": prog.step,
            "tokens": prog.tokens,
            "stopped": stop,
            "mode": self.mode,
            "resumed_from": str(self.started_from) if self.mode == "resume" else None,
            "anneal_start": prog.anneal_start,
            "anneal_reason": prog.anneal_reason,
            "skips_total": prog.skips_total,
            "spikes_total": prog.spikes_total,
            "wall_seconds": wall,
            "tok_per_s": tok_s,
            "n_params": self.trainee.model.num_parameters(),
            "flops_per_token": self.trainee.model.flops_per_token(),
            "heldout": prog.evals[-1] if prog.evals else None,
            "best_loss": prog.best_loss,
            "tiers": self.trainee.stream.tokens_per_tier(range(0, prog.step), cfg.batch_ramp.rows, self.mix),
            "branch_points": self.branch_points(),
        }


def _check_memory(cfg: TrainConfig, world: int, hw: Hardware) -> memory.Estimate:
    setup = memory.Setup(
        cfg.micro_batch,
        world,
        cfg.parallel,
        hw.precision,
        cfg.activation_checkpointing,
        cfg.optimizer,
        cfg.muon_work,
    )
    # What is free now, not the GPU's size: another process may hold part of it.
    free = torch.cuda.mem_get_info(hw.device)[0] if hw.device.type == "cuda" else None
    return memory.check_fits(cfg.model, setup, free)


def _eval_data(cfg: TrainConfig, shards: ShardSet) -> tuple[HeldOut, list[Task], Tokenizer | None]:
    """What the in-loop evals score: the held-out windows, the tasks and, for the tasks and the
    sample, the shards' tokenizer."""
    held = HeldOut.build(shards.heldout(), cfg.model.seq_len, cfg.eval_windows)
    tasks = [read_task(Path(p)) for p in cfg.task_files.values()] if cfg.task_examples else []
    tokenizer = (
        Tokenizer.from_file(str(Path(cfg.shards) / "tokenizer.json")) if cfg.sample_tokens or tasks else None
    )
    return held, tasks, tokenizer
