"""Where a run starts: everything it trains, built, and then one rule (``checkpoint.resolve_start``)
deciding between a fresh start, an exact resume of its own checkpoint, and a branch from another
run's (an anneal from ``pre_anneal``); each refused, with the reason and the fix, when the
checkpoint was made under something else."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lehr.engine import checkpoint, fp8
from lehr.engine.config import TrainConfig, math_diff
from lehr.engine.data import ShardSet, TrainStream
from lehr.engine.distributed import Dist
from lehr.engine.hardware import Hardware
from lehr.engine.model import Transformer
from lehr.engine.stopping import Progress


@dataclass
class Trainee:
    """The model and everything whose state a checkpoint holds with it."""

    model: Transformer
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    stream: TrainStream
    fp8_layers: int


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    # Decay matrices only: norm gains are not capacity, and decaying them distorts normalisation.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # Fused on every device: one kernel per step, and it honours ``found_inf`` (see guard.py).
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True)


def build(cfg: TrainConfig, hw: Hardware, shards: ShardSet) -> Trainee:
    checkpoint.seed_all(cfg.seed)
    model = Transformer(cfg.model).to(hw.device)
    fp8_layers = fp8.convert(model) if hw.precision == "fp8" else 0
    return Trainee(
        model,
        build_optimizer(model, cfg),
        hw.grad_scaler(),
        TrainStream(shards, cfg.model.seq_len, cfg.data_seed),
        fp8_layers,
    )


def start(
    cfg: TrainConfig, d: Dist, hw: Hardware, t: Trainee, rolling: checkpoint.Rolling, shards: ShardSet
) -> tuple[str, Path | None, Progress]:
    """(mode, checkpoint it started from, progress): ``fresh``, ``resume`` or ``branch``."""
    mode, path, state = checkpoint.resolve_start(rolling, cfg.init_from)
    if mode == "resume":
        _check_resumable(path, state, cfg, d, shards)
        _restore(path, t, hw.device, d.rank, with_optimizer=True)
        t.stream.load_state_dict(state["data"])
        return mode, path, Progress.from_state(state["progress"])
    if mode == "branch":
        _check_branchable(path, state, cfg, shards)
        _restore(path, t, hw.device, d.rank, with_optimizer=cfg.init_optimizer)
        checkpoint.seed_all(cfg.seed + state["progress"]["step"])  # fresh randomness for the branch
        prog = Progress(step=state["progress"]["step"], tokens=state["progress"]["tokens"])
        t.stream.load_state_dict({"data_seed": cfg.data_seed, "step": prog.step})
        return mode, path, prog
    return mode, None, Progress()


def _check_resumable(path: Path, state: dict, cfg: TrainConfig, d: Dist, shards: ShardSet) -> None:
    fix = f"or delete {cfg.out_dir} to start this run afresh"
    made_by = state.get("world_size", 1)
    if made_by != d.world:
        # Exact resume holds for the process count that made the checkpoint; resharding across
        # counts needs sharded (FSDP/DCP) checkpoints.
        raise checkpoint.CheckpointError(
            f"refusing to resume {path}: it was made by {made_by} process(es) and this run has {d.world}. "
            f"Resume with the same count (pretrain.launch.nproc_per_node x nnodes = {made_by}), {fix}."
        )
    if state["tokenizer_sha256"] != shards.manifest["tokenizer"]["sha256"]:
        raise checkpoint.CheckpointError(
            f"refusing to resume {path}: it was trained on shards of another tokenizer than {cfg.shards}. "
            f"Restore those shards (`dvc checkout`), {fix}."
        )
    if state["math_hash"] != cfg.math_hash():
        keys = math_diff(state["config_math"], cfg.math_fields())
        raise checkpoint.CheckpointError(
            f"refusing to resume {path}: it was made under another configuration ({', '.join(keys)} "
            f"differ). Restore those values, {fix}."
        )


def _check_branchable(path: Path, state: dict, cfg: TrainConfig, shards: ShardSet) -> None:
    theirs, ours = state["config"]["model"], cfg.to_dict()["model"]
    differ = [f"model.{k}" for k in sorted(ours) if theirs.get(k) != ours[k]]
    if state["tokenizer_sha256"] != shards.manifest["tokenizer"]["sha256"]:
        differ.append("tokenizer")
    if differ:
        raise checkpoint.CheckpointError(
            f"refusing to branch from {path}: it was made with another {', '.join(differ)}. Re-run the "
            f"pretrain_stable stage with the current tokenizer and model config."
        )


def _restore(path: Path, t: Trainee, device: torch.device, rank: int, with_optimizer: bool) -> None:
    checkpoint.load_weights(path, t.model)
    if with_optimizer:
        opt_state = checkpoint.load_optimizer(path, device)
        t.optimizer.load_state_dict(opt_state["optimizer"])
        t.scaler.load_state_dict(opt_state["scaler"])
    rng = checkpoint.load_rng(path, rank)
    if rng is not None:
        checkpoint.set_rng_state(rng)
