"""The run configuration of one training run, and the hash that guards exact resume."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from lehr.engine.hardware import ATTENTION
from lehr.engine.model import ModelConfig
from lehr.engine.schedule import SHAPES

# Fields that do not change the math of a step: a resumed run may change them freely.
# Everything else enters the math hash, and a resume under a different hash is refused.
RESUMABLE_FIELDS = frozenset({
    "out_dir", "shards", "total_steps", "stop_rule", "end_step", "log_every", "eval_every",
    "eval_windows", "sample_tokens", "sample_prompt", "ckpt_every", "keep_last", "compile",
    "device", "peak_tflops", "patience", "patience_from_step", "init_from", "init_optimizer",
    "micro_batch", "max_consecutive_skips", "max_epochs_warn", "provenance", "attention",
})


@dataclass(frozen=True)
class StopRule:
    """When the stable phase ends and ``pre_anneal`` is saved (auto-anneal, bounded)."""

    planned_step: int  # anneal start without auto-anneal: (1 - decay_fraction) * total_steps
    min_step: int  # auto-anneal never starts the decay before this step
    max_step: int  # ...nor after this one (the stable phase may extend up to here)
    auto: bool  # decide by the held-out curve; False = always planned_step
    stall_window: int  # evals compared: best of the last half vs best of the half before
    stall_eps: float  # nats; a gain smaller than this counts as a stall
    save_to: str  # directory where the pre_anneal checkpoint is written


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig
    shards: str  # shard folder holding manifest.json and tokenizer.json
    out_dir: str  # this run's rolling checkpoints and metrics.jsonl
    seed: int  # model init and per-rank RNGs
    data_seed: int  # training windows; an anneal branch takes a fresh one
    batch_size: int  # sequences per optimizer step, all ranks and micro-batches together
    micro_batch: int  # sequences per forward pass per rank; accumulation = batch / (micro * world)
    stable_mix: dict[str, float]  # tier -> weight before the anneal
    anneal_mix: list = field(default_factory=list)  # [[end_fraction, {tier: weight}], ...] over the decay
    lr: float = 3e-3  # peak learning rate
    min_lr: float = 3e-4  # learning rate at the end of the decay
    warmup_steps: int = 100
    weight_decay: float = 0.1  # on matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    schedule: str = "wsd"  # wsd | cosine
    total_steps: int = 1000  # nominal step budget (cosine ends here; WSD plans the anneal from it)
    anneal_start: int | None = None  # first decay step (WSD) / first anneal-mix step; None = open-ended
    anneal_steps: int = 0  # decay length in steps
    decay_shape: str = "1-sqrt"
    end_step: int | None = None  # stop before this step; None = total_steps unless stop_rule decides
    stop_rule: StopRule | None = None  # stable phase only
    init_from: str | None = None  # checkpoint to branch from when out_dir holds none
    init_optimizer: bool = True  # branch with the optimizer state too
    precision: str = "auto"  # auto | bf16 | fp16 | fp32 | fp8 (block matmuls in FP8 through torchao)
    compile: bool = False  # torch.compile the training step
    attention: str = "auto"  # SDPA kernel: auto | flash | efficient | cudnn | math (same math, other kernels)
    device: str = "auto"  # auto | cpu | cuda
    peak_tflops: float | None = None  # MFU denominator; None = from the hardware profile
    log_every: int = 10  # steps between log lines
    eval_every: int = 100  # steps between held-out evals (and sample texts)
    eval_windows: int = 16  # fixed held-out windows per source
    sample_tokens: int = 48  # tokens of text sampled at each eval; 0 = none
    sample_prompt: str = "The"
    patience: int = 0  # evals without a new best before an early stop; 0 = never
    patience_from_step: int = 0  # patience is only counted from this step (mid-decay)
    ckpt_every: int = 100  # steps between rolling checkpoints
    keep_last: int = 2  # rolling checkpoints kept
    max_consecutive_skips: int = 5  # non-finite steps in a row before aborting
    max_epochs_warn: float = 4.0  # warn at start when a tier would be repeated more often than this
    provenance: dict = field(default_factory=dict)  # git commit, data hashes... stored in checkpoints

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            object.__setattr__(self, "model", ModelConfig(**self.model))
        if isinstance(self.stop_rule, dict):
            object.__setattr__(self, "stop_rule", StopRule(**self.stop_rule))
        checks = [
            (self.lr > 0, f"lr must be positive, got {self.lr}"),
            (0 <= self.min_lr <= self.lr, f"min_lr must lie in [0, lr], got {self.min_lr}"),
            (self.batch_size > 0 and self.micro_batch > 0, "batch_size and micro_batch must be positive"),
            (self.batch_size % self.micro_batch == 0,
             f"batch_size {self.batch_size} is not a multiple of micro_batch {self.micro_batch}"),
            (self.schedule in ("wsd", "cosine"), f"schedule must be wsd or cosine, got {self.schedule!r}"),
            (self.decay_shape in SHAPES, f"decay_shape must be one of {SHAPES}, got {self.decay_shape!r}"),
            (self.precision in ("auto", "bf16", "fp16", "fp32", "fp8"), f"unknown precision {self.precision!r}"),
            (self.attention in ("auto", *ATTENTION), f"attention must be auto or one of {', '.join(ATTENTION)}"),
            (self.total_steps > 0 and self.warmup_steps >= 0, "total_steps must be positive"),
            (bool(self.stable_mix) and all(w >= 0 for w in self.stable_mix.values())
             and sum(self.stable_mix.values()) > 0, "stable_mix needs a positive weight"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def grad_accum(self, world_size: int) -> int:
        per_step = self.micro_batch * world_size
        if self.batch_size % per_step:
            raise ValueError(
                f"batch_size {self.batch_size} is not divisible by micro_batch {self.micro_batch} x "
                f"{world_size} processes; choose a batch_size that is"
            )
        return self.batch_size // per_step

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        return cls(**d)

    def math_fields(self) -> dict:
        return {k: v for k, v in self.to_dict().items() if k not in RESUMABLE_FIELDS}

    def math_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.math_fields(), sort_keys=True).encode()).hexdigest()[:16]


def math_diff(old: dict, new: dict) -> list[str]:
    """Keys (dotted) whose values differ between two ``math_fields`` dicts."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict) and key == "model":
            out += [f"model.{k}" for k in math_diff(a, b)]
        elif a != b:
            out.append(key)
    return out
