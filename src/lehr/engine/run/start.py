"""Where a run starts: everything it trains, built, and then one rule (``checkpoint.resolve_start``)
deciding between a fresh start, an exact resume of its own checkpoint, and a branch from another
run's (an anneal from ``pre_anneal``); each refused, with the reason and the fix, when the
checkpoint was made under something else."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lehr import fixes, versions
from lehr.engine import fp8, optim
from lehr.engine.artifacts import checkpoint, code_identity, sharded_checkpoint
from lehr.engine.batches import ShardSet, TrainStream
from lehr.engine.config import OptimizerConfig, TrainConfig, math_diff
from lehr.engine.hardware import Hardware
from lehr.engine.model import Transformer
from lehr.engine.processes import parallel
from lehr.engine.processes.distributed import Dist
from lehr.engine.run import plan, tail
from lehr.engine.run.stopping import Progress

log = logging.getLogger("lehr.train")


@dataclass
class Trainee:
    """The model and everything whose state a checkpoint holds with it."""

    model: Transformer
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    stream: TrainStream
    fp8_layers: int


def build(cfg: TrainConfig, hw: Hardware, shards: ShardSet) -> Trainee:
    checkpoint.seed_all(cfg.seed)
    model = Transformer(cfg.model).to(hw.device)
    fp8_layers = fp8.convert(model) if hw.precision == "fp8" else 0
    model.checkpoint_blocks = cfg.activation_checkpointing == "blocks"
    if cfg.parallel == "fsdp":  # every rank built the same model; each now keeps its shard of it
        parallel.shard(model, hw)
    return Trainee(
        model,
        optim.build(model, cfg),
        hw.grad_scaler(),
        TrainStream(shards, cfg.model.seq_len, cfg.data_seed, cfg.packing),
        fp8_layers,
    )


def start(
    cfg: TrainConfig,
    dist: Dist,
    hw: Hardware,
    trainee: Trainee,
    rolling: checkpoint.Rolling,
    shards: ShardSet,
) -> tuple[str, Path | None, Progress]:
    """(mode, checkpoint it started from, progress): ``fresh``, ``resume`` or ``branch``."""
    mode, path, state = checkpoint.resolve_start(rolling, cfg.init_from)
    if mode == "resume":
        assert path is not None and state is not None  # resolve_start gives both to a resume or a branch
        _check_resumable(path, state, cfg, shards)
        prog = Progress.from_state(state["progress"])
        # A plan (budget, stop rule, early stop) other than the checkpoint's: goes on to the new
        # plan's end where the steps trained are the new plan's, refused before any work otherwise.
        plan.settle(path, state, cfg, prog, dist.is_main)
        _restore(path, state, trainee, cfg, dist, with_optimizer=True)
        trainee.stream.load_state_dict(state["data"])
    elif mode == "branch":
        assert path is not None and state is not None
        _check_branchable(path, state, cfg, shards)
        if (changes := optimizer_changes(state, cfg)) and dist.is_main:
            log.warning(
                "this branch's optimizer differs from its origin's: %s (pass the stable run's "
                "pretrain params to keep them)",
                ", ".join(changes),
            )
        _restore(path, state, trainee, cfg, dist, with_optimizer=cfg.init_optimizer)
        tail.drop(trainee.optimizer)  # an origin saved inside its own tail: this branch sums its own
        checkpoint.seed_all(cfg.seed + state["progress"]["step"])  # fresh randomness for the branch
        prog = Progress(
            step=state["progress"]["step"],
            tokens=state["progress"]["tokens"],
            trained_by=list(state["progress"].get("trained_by", [])),
        )
        trainee.stream.load_state_dict({"data_seed": cfg.data_seed, "step": prog.step})
    else:
        prog = Progress()
    if not prog.world_sizes or prog.world_sizes[-1][1] != dist.world:
        prog.world_sizes.append([prog.step, dist.world])  # [from step, processes]: the run's history
    _record_trainer(prog, mode)
    return mode, path, prog


def _record_trainer(prog: Progress, mode: str) -> None:
    """Add this process's code and versions to the run's history when they are not those of the
    range before (a resume by the same code adds nothing: its record equals an uninterrupted
    run's). Not the git commit: the same code at a later commit makes the same checkpoint."""
    me = {
        "from_step": prog.step,
        "code_sha256": code_identity.of_training().sha256,
        "versions": versions.deciding(),
    }
    last = prog.trained_by[-1] if prog.trained_by else None
    same = last is not None and all(last.get(k) == me[k] for k in me if k != "from_step")
    if not same or mode == "branch":  # a branch's own range starts here even under the same code
        prog.trained_by.append(me)


def _check_resumable(path: Path, state: dict[str, Any], cfg: TrainConfig, shards: ShardSet) -> None:
    fix = f"or delete {cfg.out_dir} to start this run afresh"
    if state["tokenizer_sha256"] != shards.manifest["tokenizer"]["sha256"]:
        raise checkpoint.CheckpointError(
            f"refusing to resume {path}: it was trained on shards of another tokenizer than {cfg.shards}. "
            "Restore the shards it was trained on (check out the commit its state.json names, then "
            f"`{fixes.restore(cfg.shards)}`), {fix}."
        )
    if state["math_hash"] != cfg.math_hash():
        keys = math_diff(state["config_math"], cfg.math_fields())
        raise checkpoint.CheckpointError(
            f"refusing to resume {path}: it was made under another configuration ({', '.join(keys)} "
            f"differ). Restore those values, {fix}."
        )
    made_by, ours = state.get("code", {}), code_identity.of_training()
    if made_by.get("sha256") != ours.sha256:
        files = (
            code_identity.differing(made_by["modules"], ours.modules)
            if made_by
            else ["the engine (the checkpoint records no code identity: it predates the record)"]
        )
        if not cfg.resume_under_new_code:
            raise checkpoint.CheckpointError(
                f"refusing to resume {path}: it was trained by other engine code ({', '.join(files)} "
                f"differ{'s' if len(files) == 1 else ''} in what it executes). Restore that code (git "
                f"checkout the commit in its state.json), set pretrain.resume_under_new_code: true to "
                f"continue under this code (the record then names both), {fix}."
            )
        log.warning(
            "resuming %s under other engine code (%s differ), as pretrain.resume_under_new_code "
            "allows; the checkpoint's record names both",
            path,
            ", ".join(files),
        )
    other = versions.differing(state.get("versions"))
    if other:
        if not cfg.resume_under_new_code:
            raise checkpoint.CheckpointError(
                f"refusing to resume {path}: it was trained under other versions ({', '.join(other)}), "
                f"which can make other numbers. Install those (make setup at the commit in its state.json, "
                f"with that torch as TORCH_SPEC), set pretrain.resume_under_new_code: true to continue "
                f"under these (the record then names both), {fix}."
            )
        log.warning(
            "resuming %s under other versions (%s), as pretrain.resume_under_new_code allows; the "
            "checkpoint's record names both",
            path,
            ", ".join(other),
        )


def _check_branchable(path: Path, state: dict[str, Any], cfg: TrainConfig, shards: ShardSet) -> None:
    # A field a record leaves out is at its "not in use" value: compared over both records' fields.
    theirs, ours = state["config"]["model"], cfg.to_dict()["model"]
    differ = [
        f"model.{k} ({theirs.get(k, 'off')} there, {ours.get(k, 'off')} here)"
        for k in math_diff(theirs, ours)
    ]
    if state["tokenizer_sha256"] != shards.manifest["tokenizer"]["sha256"]:
        differ.append("tokenizer")
    made_with = state["config"].get("optimizer", "adamw")  # checkpoints before Muon: AdamW
    if cfg.init_optimizer and made_with != cfg.optimizer:
        raise checkpoint.CheckpointError(
            f"refusing to branch from {path} with its optimizer state: it was made with optimizer "
            f"{made_with}, and this run's optimizer is {cfg.optimizer}. Branch with fresh optimizer "
            f"state (anneal.init_optimizer: false), or set pretrain.optimizer: {made_with}."
        )
    if differ:
        raise checkpoint.CheckpointError(
            f"refusing to branch from {path}: it was made with another {', '.join(differ)}. A branch "
            f"builds its model from the pretrain params: give it the stable run's "
            f"pretrain.model.overrides (and tokenizer), or re-run the pretrain_stable stage."
        )


def optimizer_changes(state: dict[str, Any], cfg: TrainConfig) -> list[str]:
    """The optimizer's math settings a branch trains with that its origin was not trained with
    (a branch reads the pretrain params as they are now: a stable phase run by hand with other
    ``--params`` is not what they say)."""
    if "config_math" not in state:  # checkpoints before it was recorded
        return []
    theirs, ours = state["config_math"], cfg.math_fields()
    keys = {f.name for f in dataclasses.fields(OptimizerConfig)}
    changed = [k for k in math_diff(theirs, ours) if k in keys]
    return [f"{k} {ours.get(k, 'off')} (origin: {theirs.get(k, 'off')})" for k in changed]


def _restore(
    path: Path, state: dict[str, Any], trainee: Trainee, cfg: TrainConfig, dist: Dist, with_optimizer: bool
) -> None:
    """Weights, optimizer and scaler, and this rank's RNG states, whatever the checkpoint's kind
    (single file or DCP shards) and process count and whatever this run's: each is resharded."""
    optimizer = trainee.optimizer if with_optimizer else None
    if sharded_checkpoint.is_sharded(path):
        sharded_checkpoint.load(path, trainee.model, optimizer)
        if optimizer is not None:
            trainee.scaler.load_state_dict(sharded_checkpoint.load_scaler(path))
    else:
        if parallel.is_sharded(trainee.model):
            whole = Transformer(cfg.model)  # the file's weights, whole on the CPU, then resharded
            checkpoint.load_weights(path, whole)
            parallel.load_full_model_state(trainee.model, whole.state_dict())
        else:
            checkpoint.load_weights(path, trainee.model)
        if optimizer is not None:
            saved = checkpoint.load_optimizer(path, torch.device("cpu"))
            if parallel.is_sharded(trainee.model) and parallel.keyed_by_position(saved["optimizer"]):
                raise checkpoint.CheckpointError(
                    f"refusing to load {path}'s optimizer state under parallel: fsdp: it is keyed by "
                    "parameter position (saved before 2026-12-01), which cannot be matched to FSDP's "
                    "shards. Resume it once under parallel: ddp (its next checkpoint is keyed by name), "
                    "or branch with fresh optimizer state (anneal.init_optimizer: false)."
                )
            parallel.load_full_optimizer_state(trainee.model, optimizer, saved["optimizer"])
            trainee.scaler.load_state_dict(saved["scaler"])
    rng = checkpoint.load_rng(path, dist.rank)
    if rng is not None:
        checkpoint.set_rng_state(rng)
        return
    # A rank the checkpoint did not have: its generators start from the seed, the step and the rank,
    # the same on every rerun. Training draws no randomness on these ranks; evals run on rank 0.
    checkpoint.seed_all(cfg.seed + state["progress"]["step"] * 1009 + dist.rank)
    log.info(
        "rank %d: %s, made by %d process(es), holds no RNG state for this rank; seeded from the step",
        dist.rank,
        path,
        state.get("world_size", 1),
    )
