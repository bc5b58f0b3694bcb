"""The configuration of one training run, declared once, in parts.

Each part (schedule, optimizer, data, hardware, eval, checkpointing, ...) is a frozen dataclass
that declares its settings with their types, defaults and checks. ``TrainConfig`` is every part
together; the Kedro stage params (``lehr.params.stages``) inherit the same parts, so a setting such as
``lr`` is declared, defaulted and validated here and nowhere else, and a stage's params become a
``TrainConfig`` by taking the fields the parts share (``lehr.training.train_config``) instead of copying them.
An anneal branch's own settings are one more part, ``BranchConfig``, applied by
``TrainConfig.branch``.

A field either changes the math of a step or it does not (``setting(resumable=True)``): the math
fields make the hash that an exact resume must match. A field added after checkpoints existed
declares its "not in use" value (``setting(off=...)``), at which it stays out of that hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from lehr.config_parts import (
    Part,
    check_mix,
    not_in_use,
    require,
    require_positive,
    require_seed,
    resumable,
    setting,
)
from lehr.engine.batches import Packing
from lehr.engine.hardware import Attention
from lehr.engine.model import ModelConfig
from lehr.engine.optim import Optimizer
from lehr.engine.optim.muon_work import MuonWork
from lehr.engine.optim.newton_schulz import OrthogonaliserName
from lehr.engine.schedule import BatchRamp, DecayShape, cooldown_steps

# Part checks each field's value against its annotation at run time: a bare ``list`` admits a list
# only (``list[...]`` lets a tuple through), and a refusal names a bare ``dict`` as "dict". These
# fields keep the bare types there; the type checker reads the parametrised ones.
if TYPE_CHECKING:
    AnnealMix = list[Any]
    Record = dict[str, Any]
else:
    AnnealMix, Record = list, dict


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig(Part):
    """The learning rate over the steps: warmup, then WSD's stable phase or a cosine."""

    schedule: Literal["wsd", "cosine"] = (
        "wsd"  # cosine = the baseline: one warmup + cosine over planned_steps
    )
    lr: float = 6e-3  # peak learning rate (with muon: of the AdamW groups)
    min_lr: float = 6e-4  # floor of the cosine; WSD decays to the anneal's own min_lr
    warmup_steps: int = 40
    # The planned length in optimizer steps: the planned stable phase and the planned decay. The
    # fractions of the stable phase and the anneal are of it; auto-anneal may stop the stable phase
    # later than planned (up to auto_anneal.max_fraction), so a run can be longer: 490 + 280 steps.
    planned_steps: int = setting(700, resumable=True, renamed_from="total_steps")

    def check(self) -> None:
        require_positive(self, "lr", "planned_steps")
        require(0 <= self.min_lr <= self.lr, "min_lr", self.min_lr, "must lie in [0, lr]")
        require(self.warmup_steps >= 0, "warmup_steps", self.warmup_steps, "must be >= 0")


MUON_INGREDIENTS = ("muon_orthogonaliser", "muon_cautious_decay", "muon_normuon_beta2")  # docs/recipe.md
# The recipe's ingredients that are not the model's.
RUN_INGREDIENTS = (*MUON_INGREDIENTS, "packing", "batch_warmup_steps")


def _under_muon(cfg: OptimizerConfig) -> bool:
    return cfg.optimizer == "muon"


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig(Part):
    """The objective and the update: AdamW, or Muon on the hidden matrices with AdamW on the rest
    (``optim``); global-norm clipping; an optional z-loss on the logits."""

    optimizer: Optimizer = setting("muon", off="adamw")  # adamw came first
    weight_decay: float = 0.1  # AdamW's matrices only (with muon: embeddings and head)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global grad norm; 0 = off
    # muon: the attention and MLP matrices. Its LR is the peak of the orthogonalised update per
    # step (scaled by sqrt(max(1, rows / cols)), Keller Jordan's rule), following lr's schedule.
    muon_lr: float = setting(0.02, used_if=_under_muon)
    muon_momentum: float = setting(0.95, used_if=_under_muon)  # Nesterov
    muon_weight_decay: float = setting(0.0, used_if=_under_muon)  # decoupled, per unit of muon_lr
    # Muon's ingredients (their sources in ``optim``): the orthogonalisation's coefficients; decay
    # only where the update also shrinks the weight; NorMuon's running mean of each neuron's squared
    # update, which evens the neurons' steps out (its beta2, 0.95 in the paper; 0 = off).
    muon_orthogonaliser: OrthogonaliserName = setting("newton_schulz", off="newton_schulz")
    muon_cautious_decay: bool = setting(False, off=False)
    muon_normuon_beta2: float = setting(0.0, off=0.0)
    z_loss: float = setting(
        0.0, off=0.0
    )  # weight of mean(logsumexp(logits)^2) added to the loss (PaLM: 1e-4); 0 = off
    # Under DDP or FSDP: shared = each process orthogonalises its share of Muon's matrices
    # (balanced by cost) and they swap results; redundant = each does all of them. The same update.
    muon_work: MuonWork = setting("shared", resumable=True)

    def check(self) -> None:
        require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        for key in ("beta1", "beta2", "muon_momentum"):
            require(0 <= getattr(self, key) < 1, key, getattr(self, key), "must lie in [0, 1)")
        require(self.grad_clip >= 0, "grad_clip", self.grad_clip, "must be >= 0 (0 = no clipping)")
        require(self.muon_lr > 0, "muon_lr", self.muon_lr, "must be positive (e.g. 0.02)")
        require(self.muon_weight_decay >= 0, "muon_weight_decay", self.muon_weight_decay, "must be >= 0")
        require(self.z_loss >= 0, "z_loss", self.z_loss, "must be >= 0 (0 = off; 1e-4 is usual)")
        require(
            0 <= self.muon_normuon_beta2 < 1,
            "muon_normuon_beta2",
            self.muon_normuon_beta2,
            "must lie in [0, 1) (0 = off; NorMuon's paper uses 0.95)",
        )
        off = {f.name: f.metadata["off"] for f in dataclasses.fields(self) if f.name in MUON_INGREDIENTS}
        for key in MUON_INGREDIENTS:
            require(
                getattr(self, key) == off[key] or self.optimizer == "muon",
                key,
                getattr(self, key),
                f"is Muon's: set optimizer: muon, or leave it at {off[key]!r}",
            )
        require(
            not self.muon_cautious_decay or self.muon_weight_decay > 0,
            "muon_cautious_decay",
            True,
            "decays nothing while muon_weight_decay is 0: set muon_weight_decay (e.g. 0.1)",
        )


@dataclass(frozen=True, kw_only=True)
class DataConfig(Part):
    """What a step draws: how many sequences, split how, from which tiers."""

    data_seed: int = 1  # training windows; an anneal branch takes a fresh one
    # What a row holds (lehr.engine.batches): a window at a random position, or whole documents
    # from its start, best fit (nanochat's BOS-aligned packing; docs/recipe.md).
    packing: Packing = setting("windows", off="windows")
    batch_size: int = 16  # sequences per optimizer step, all processes and micro-batches together
    micro_batch: int = setting(
        8, resumable=True
    )  # sequences per forward pass per process; accumulation makes up the rest
    stable_mix: dict[str, float] = field(
        default_factory=lambda: {"gold": 1.0, "silver": 1.0}
    )  # tier -> weight
    # warn at start when a tier would be repeated more often (epochs)
    max_epochs_warn: float = setting(4.0, resumable=True)
    # A batch-size warmup (modded-nanogpt record #46 ramps the batch up in stages; early steps learn
    # common patterns from few sequences): the first batch_warmup_steps steps draw
    # batch_warmup_start sequences, then 2x, 3x ... that, in stages as equal as whole steps allow,
    # below batch_size. The same steps then train fewer tokens (``BatchRamp.rows_before``); 0 = off.
    batch_warmup_steps: int = setting(0, off=0)
    batch_warmup_start: int = setting(4, used_if=lambda c: c.batch_warmup_steps != 0)

    def check(self) -> None:
        require_positive(self, "batch_size", "micro_batch", "max_epochs_warn", "batch_warmup_start")
        require(
            self.batch_size % self.micro_batch == 0,
            "batch_size",
            self.batch_size,
            f"is not a multiple of micro_batch {self.micro_batch}",
        )
        require(
            self.batch_warmup_steps >= 0,
            "batch_warmup_steps",
            self.batch_warmup_steps,
            "must be >= 0 (0 = off)",
        )
        if self.batch_warmup_steps:
            start, batch = self.batch_warmup_start, self.batch_size
            divisors = [d for d in range(1, batch) if batch % d == 0]
            example = (
                f"e.g. {max(d for d in divisors if d <= max(1, batch // 4))}"
                if divisors
                else ("a batch_size of 1 has none: set batch_warmup_steps: 0")
            )
            require(
                start in divisors,
                "batch_warmup_start",
                start,
                f"must divide batch_size {batch} and be smaller: the warmup's stages draw {start}, "
                f"{2 * start}, ... sequences below it ({example})",
            )
            require(
                self.batch_warmup_steps >= batch // start - 1,
                "batch_warmup_steps",
                self.batch_warmup_steps,
                f"is fewer than the warmup's {batch // start - 1} stages ({start} to {batch - start} "
                f"sequences by {start}): give each a step at least, or a larger batch_warmup_start",
            )
        require_seed("data_seed", self.data_seed)
        check_mix(self.stable_mix, "stable_mix")

    @property
    def batch_ramp(self) -> BatchRamp:
        """The sequences each step draws (``schedule.BatchRamp``)."""
        return BatchRamp(self.batch_size, self.batch_warmup_steps, self.batch_warmup_start)


@dataclass(frozen=True, kw_only=True)
class HardwareConfig(Part):
    """Where and in what precision the math runs; none of it changes what a step computes beyond
    the rounding of its products."""

    # auto: bf16 (fp16 on GPUs without it); on a CPU bf16 where it has bf16 instructions, else fp32
    precision: Literal["auto", "bf16", "fp16", "fp32", "fp8"] = "auto"
    compile: bool = setting(True, resumable=True)  # torch.compile the training step (docs/benchmarks.md)
    # SDPA kernel; auto = PyTorch picks (same math)
    attention: Attention = setting("auto", resumable=True)
    device: Literal["auto", "cpu", "cuda"] = setting("auto", resumable=True)
    peak_tflops: float | None = setting(
        None, resumable=True
    )  # MFU denominator; None = the hardware profile's
    # ddp: every process holds the whole model and optimizer; fsdp: FSDP2 shards parameters,
    # gradients and optimizer state across processes (checkpoints then go through DCP).
    parallel: Literal["ddp", "fsdp"] = setting("ddp", resumable=True)
    # blocks: recompute each in the backward
    activation_checkpointing: Literal["none", "blocks"] = setting("none", resumable=True)
    async_save: bool = setting(
        False, resumable=True
    )  # fsdp: a rolling checkpoint completes while training goes on

    def check(self) -> None:
        require(
            not (self.parallel == "fsdp" and self.precision == "fp8"),
            "precision",
            self.precision,
            "is not supported with parallel: fsdp yet; use bf16 with fsdp, or fp8 with ddp",
        )


# What ``decide_by`` may name; lower is better for the held-out figures, higher for the task ones.
HELDOUT_METRICS = ("heldout.loss", "heldout.bpb")
TASK_METRICS = ("acc", "acc_norm", "loglik")


def task_metric(metric: str) -> tuple[str, str] | None:
    """(task, figure) of ``tasks.<task>.<figure>`` (a task name may hold dots); None otherwise."""
    if not metric.startswith("tasks."):
        return None
    task, _, figure = metric.removeprefix("tasks.").rpartition(".")
    return task, figure


@dataclass(frozen=True, kw_only=True)
class EvalConfig(Part):
    """Held-out evals during training: how often, on how much, task evals, and a sample of text."""

    log_every: int = setting(20, resumable=True)  # steps between log lines (each one a host sync)
    eval_every: int = setting(80, resumable=True)  # steps between held-out evals
    eval_windows: int = setting(32, resumable=True)  # fixed held-out windows per source
    sample_tokens: int = setting(32, resumable=True)  # tokens of text sampled at each eval; 0 = none
    sample_prompt: str = setting("The", resumable=True)
    # examples of each task scored at every eval (the first ones); 0 = no task evals
    task_examples: int = setting(100, resumable=True)
    # The eval figure auto-anneal, early stop and the best checkpoint go by: heldout.loss,
    # heldout.bpb or tasks.<task>.<acc|acc_norm|loglik> (stall_eps is then in its units).
    decide_by: str = setting("heldout.loss", resumable=True)

    def check(self) -> None:
        require_positive(self, "log_every", "eval_every", "eval_windows")
        require(self.sample_tokens >= 0, "sample_tokens", self.sample_tokens, "must be >= 0")
        require(self.task_examples >= 0, "task_examples", self.task_examples, "must be >= 0 (0 = none)")
        parsed = task_metric(self.decide_by)
        require(
            self.decide_by in HELDOUT_METRICS
            or (parsed is not None and parsed[0] != "" and parsed[1] in TASK_METRICS),
            "decide_by",
            self.decide_by,
            f"must be one of {', '.join(HELDOUT_METRICS)} or tasks.<task>.<{'|'.join(TASK_METRICS)}>",
        )


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig(Part):
    ckpt_every: int = setting(40, resumable=True)  # steps between rolling checkpoints
    keep_last: int = setting(2, resumable=True)  # rolling checkpoints kept
    # A resume under engine code, or versions of what decides bytes (lehr.versions), other than
    # the checkpoint's is refused (naming what differs); true continues, and the record keeps both.
    resume_under_new_code: bool = setting(False, resumable=True)

    def check(self) -> None:
        require_positive(self, "ckpt_every", "keep_last")


@dataclass(frozen=True, kw_only=True)
class GuardConfig(Part):
    """What a step is skipped for: a non-finite grad norm always; a loss spike when spike_sigma > 0."""

    seed: int = 0  # model init and the per-rank RNGs
    # non-finite steps in a row before the run aborts
    max_consecutive_skips: int = setting(5, resumable=True)
    # A step whose loss exceeds the mean of the last spike_window steps' losses by more than
    # spike_sigma of their standard deviations is skipped (OLMo-core's rule); 0 = never.
    spike_sigma: float = setting(0.0, off=0.0)
    # steps; no step is skipped as a spike before the window is full
    spike_window: int = setting(64, used_if=lambda c: c.spike_sigma != 0)

    def check(self) -> None:
        require_seed("seed", self.seed)
        require_positive(self, "max_consecutive_skips")
        require(
            self.spike_sigma >= 0, "spike_sigma", self.spike_sigma, "must be >= 0 (0 = no spike skipping)"
        )
        require(self.spike_window >= 2, "spike_window", self.spike_window, "must be at least 2")


@dataclass(frozen=True, kw_only=True)
class Launch(Part):
    """How many processes train, on how many machines (``launch`` starts them)."""

    nproc_per_node: int = 1  # processes on this machine (GPUs, or CPU workers on gloo); 1 = in-process
    nnodes: int = 1  # machines taking part; more than 1 needs rdzv_endpoint reachable from all
    node_rank: int = 0
    rdzv_endpoint: str = "127.0.0.1:29500"  # host:port of the rendezvous (node 0)
    # static: node i's processes take ranks i * nproc_per_node ..., so node 0 holds rank 0 (and the
    # stage's outputs); c10d: elastic membership, ranks in an order of the rendezvous' choosing.
    rdzv_backend: Literal["static", "c10d"] = "static"
    max_restarts: int = 0  # torchrun restarts the whole group this often after a worker dies, resuming

    def check(self) -> None:
        require(self.nproc_per_node >= 1, "nproc_per_node", self.nproc_per_node, "must be at least 1")
        require(self.nnodes >= 1, "nnodes", self.nnodes, "must be at least 1")
        require(
            0 <= self.node_rank < self.nnodes,
            "node_rank",
            self.node_rank,
            f"must lie in [0, nnodes = {self.nnodes})",
        )
        require(self.max_restarts >= 0, "max_restarts", self.max_restarts, "must be >= 0")


# The parts a stage's params and the engine share, in the order a reader meets them.
SHARED_PARTS = (
    ScheduleConfig,
    OptimizerConfig,
    DataConfig,
    HardwareConfig,
    EvalConfig,
    CheckpointConfig,
    GuardConfig,
)


@dataclass(frozen=True)
class StopRule:
    """When the stable phase ends and ``pre_anneal`` is saved (auto-anneal, bounded)."""

    planned_step: int  # anneal start without auto-anneal: (1 - planned_decay_fraction) * planned_steps
    min_step: int  # auto-anneal never starts the decay before this step
    max_step: int  # ...nor after this one (the stable phase may extend up to here)
    auto: bool  # decide by the held-out curve; False = always planned_step
    stall_window: int  # evals compared: best of the last half vs best of the half before
    stall_eps: float  # nats; a gain smaller than this counts as a stall
    save_to: str  # directory where the pre_anneal checkpoint is written
    keep: tuple[int, ...] = ()  # steps whose checkpoints are kept for good (pretrain.branch_points)
    keep_to: str = ""  # ...in this folder, one tokens-<N> subfolder each

    def kept_name(self, tokens: int) -> str:
        return f"tokens-{tokens}"


def check_phases(mix: list[Any], key: str) -> None:
    """An anneal mix: [[end_fraction, {tier: weight}], ...], phases whose ends rise within (0, 1]."""
    require(
        bool(mix)
        and all(isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[1], dict) for p in mix),
        key,
        mix,
        "must be a list of [end_fraction, {tier: weight}] pairs",
    )
    ends = [p[0] for p in mix]
    require(
        all(isinstance(e, (int, float)) and not isinstance(e, bool) and 0 < e <= 1 for e in ends)
        and ends == sorted(ends)
        and len(set(ends)) == len(ends),
        key,
        mix,
        f"has phase end fractions {ends}: they must rise strictly within (0, 1], "
        f"e.g. [[0.5, {{silver: 1}}], [1.0, {{gold: 1}}]]",
    )
    for i, (_, weights) in enumerate(mix):
        check_mix(weights, f"{key}[{i}]")


@dataclass(frozen=True, kw_only=True)
class DecayConfig(Part):
    """The anneal: where the decay starts, how long and in what shape, and the data mix over it."""

    anneal_start: int | None = None  # first decay step (WSD) / first anneal-mix step; None = open-ended
    anneal_steps: int = 0  # decay length in steps
    decay_shape: DecayShape = "1-sqrt"
    # [[end_fraction, {tier: weight}], ...] over the decay
    anneal_mix: AnnealMix = field(default_factory=list)
    # The run's last steps whose weights are averaged into its final model (``run.tail``); 0 = off.
    tail_steps: int = setting(0, off=0)

    def check(self) -> None:
        require(self.anneal_steps >= 0, "anneal_steps", self.anneal_steps, "must be >= 0")
        require(self.tail_steps >= 0, "tail_steps", self.tail_steps, "must be >= 0 (0 = off)")
        if self.anneal_mix:  # none = the stable mix throughout
            check_phases(self.anneal_mix, "anneal_mix")


@dataclass(frozen=True, kw_only=True)
class BranchConfig(Part):
    """An anneal branch from a saved checkpoint: the branch's own decay, data and early stop, which
    take the place of the stable run's in the config it trains under (``TrainConfig.branch``)."""

    decay_steps: int = 0  # decay length in steps; 0 = decay_ratio or decay_fraction below
    # Of the steps trained before the branch's origin (Hagele et al. 2024 decay 20% of them): a
    # decay that scales with the branch point; 0 = off.
    decay_ratio: float = setting(0.0, off=0.0)  # came after branches had names
    decay_fraction: float = 0.4  # of planned_steps, when decay_steps and decay_ratio are 0
    shape: DecayShape = "1-sqrt"
    min_lr: float = 0.0  # learning rate at the end of the decay
    # phases over the decay
    mix: AnnealMix = field(default_factory=lambda: [[1.0, {"gold": 1.0, "silver": 1.0}]])
    data_seed: int = 2  # a fresh seed, so the branch does not replay the stable windows
    # Carry the optimizer's state over from the checkpoint: AdamW's moments and, under Muon, its momentum.
    init_optimizer: bool = True
    patience: int = 2  # evals without a new best before an early stop, counted from mid-decay; 0 = off
    eval_every: int = 40  # steps
    # Of the decay's steps, the last ones whose weights are averaged (uniformly, each step's) into
    # the branch's final model: tail averaging (the peers' Tail-EMA, about -1%). 0 = off.
    tail_fraction: float = setting(0.0, off=0.0)

    def check(self) -> None:
        require(self.decay_steps >= 0, "decay_steps", self.decay_steps, "must be >= 0")
        require(
            0 <= self.tail_fraction <= 1,
            "tail_fraction",
            self.tail_fraction,
            "must lie in [0, 1] (0 = off; 0.2 averages the decay's last fifth)",
        )
        require(
            0 <= self.decay_ratio <= 1,
            "decay_ratio",
            self.decay_ratio,
            "must lie in [0, 1] (0 = off; 0.2 is usual)",
        )
        require(
            not (self.decay_steps and self.decay_ratio),
            "decay_ratio",
            self.decay_ratio,
            f"and decay_steps = {self.decay_steps} both set the decay's length: set one, the other to 0",
        )
        require(0 < self.decay_fraction < 1, "decay_fraction", self.decay_fraction, "must lie in (0, 1)")
        require(self.min_lr >= 0, "min_lr", self.min_lr, "must be >= 0")
        check_phases(self.mix, "mix")
        require_seed("data_seed", self.data_seed)
        require(self.patience >= 0, "patience", self.patience, "must be >= 0 (0 = off)")
        require_positive(self, "eval_every")

    def length(self, planned_steps: int, start: int) -> int:
        """The decay's steps, for a run planned to be ``planned_steps`` long branched at ``start``."""
        if self.decay_ratio:
            return cooldown_steps(self.decay_ratio, start)
        return self.decay_steps or cooldown_steps(self.decay_fraction, planned_steps)


@dataclass(frozen=True, kw_only=True)
class StopConfig(Part):
    """What ends the run besides its budget; the policies in ``stopping`` read these."""

    # stop before this step; None = planned_steps unless stop_rule decides
    end_step: int | None = setting(None, resumable=True)
    stop_rule: StopRule | None = setting(None, resumable=True)  # the stable phase only
    patience: int = setting(0, resumable=True)  # evals without a new best before an early stop; 0 = never
    patience_from_step: int = setting(
        0, resumable=True
    )  # patience is only counted from this step (mid-decay)

    def __post_init__(self) -> None:
        if isinstance(self.stop_rule, dict):  # from a job file
            object.__setattr__(self, "stop_rule", StopRule(**self.stop_rule))
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class TrainConfig(
    StopConfig,
    DecayConfig,
    # SHARED_PARTS reversed, written out for the type checker (the assert below holds them together)
    GuardConfig,
    CheckpointConfig,
    EvalConfig,
    HardwareConfig,
    DataConfig,
    OptimizerConfig,
    ScheduleConfig,
):
    """One training run: every part, plus the model, the data and where it writes."""

    model: ModelConfig
    shards: str = setting(resumable=True)  # shard folder holding manifest.json and tokenizer.json
    out_dir: str = setting(resumable=True)  # this run's rolling checkpoints and metrics.jsonl
    init_from: str | None = setting(None, resumable=True)  # checkpoint to branch from when out_dir holds none
    init_optimizer: bool = setting(True, resumable=True)  # branch with the optimizer state too
    # data hashes, profile, stage (lehr.tracking.provenance), stored in checkpoints; no commit
    provenance: Record = setting(factory=dict, resumable=True)
    task_files: dict[str, str] = setting(
        factory=dict, resumable=True
    )  # task name -> JSONL file, scored at evals

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):  # from a job file
            object.__setattr__(self, "model", ModelConfig(**self.model))
        super().__post_init__()

    def check(self) -> None:
        require(
            not self.tail_steps or (self.anneal_start is not None and self.tail_steps <= self.anneal_steps),
            "tail_steps",
            self.tail_steps,
            f"averages the decay's last steps: it needs an anneal_start and at most anneal_steps "
            f"({self.anneal_steps}) of them",
        )
        if parsed := task_metric(self.decide_by):
            task, _ = parsed
            require(
                task in self.task_files and self.task_examples > 0,
                "decide_by",
                self.decide_by,
                "names a task the evals do not score: the tasks are "
                f"{', '.join(sorted(self.task_files)) or 'none'} (task_examples = {self.task_examples} "
                "per eval; it must be > 0)",
            )

    def branch(self, b: BranchConfig, start: int, init_from: str) -> TrainConfig:
        """This run's settings, branched from ``init_from`` (saved at step ``start``) under ``b``:
        WSD decays for ``b.length`` steps; the cosine baseline finishes its schedule, spending
        exactly ``planned_steps``, like WSD's planned stable phase and decay."""
        end = self.planned_steps if self.schedule == "cosine" else start + b.length(self.planned_steps, start)
        return dataclasses.replace(
            self,
            data_seed=b.data_seed,
            eval_every=b.eval_every,
            min_lr=b.min_lr if self.schedule == "wsd" else self.min_lr,
            anneal_mix=b.mix,
            anneal_start=start,
            anneal_steps=end - start,
            decay_shape=b.shape,  # a branch has one decay: anneal.shape; the run has a stable phase too
            end_step=end,
            init_from=init_from,
            init_optimizer=b.init_optimizer,
            patience=b.patience,
            patience_from_step=start + (end - start) // 2,
            tail_steps=max(1, round(b.tail_fraction * (end - start))) if b.tail_fraction else 0,
        )

    @property
    def ingredients(self) -> list[str]:
        """The run's ingredients in use (the model's are ``model.ingredients``), as ``field=value``."""
        unused = not_in_use(self)
        return [f"{k}={getattr(self, k)}" for k in RUN_INGREDIENTS if k not in unused]

    def check_split(self, world_size: int) -> None:
        """Every step's sequences split evenly over the processes (each process's share in
        micro-batches of micro_batch, the last of a warmup stage's maybe smaller)."""
        per_step = self.micro_batch * world_size
        if self.batch_size % per_step:
            raise ValueError(
                f"batch_size {self.batch_size} is not divisible by micro_batch {self.micro_batch} x "
                f"{world_size} processes; choose a batch_size that is"
            )
        if self.batch_warmup_steps and self.batch_warmup_start % world_size:
            raise ValueError(
                f"batch_warmup_start {self.batch_warmup_start} does not split evenly over {world_size} "
                f"processes; choose a multiple of {world_size} that divides batch_size, or set "
                "batch_warmup_steps: 0"
            )

    def to_dict(self) -> dict[str, Any]:
        """For files (checkpoint state, a torchrun job); in-process, the object itself travels."""
        return {**dataclasses.asdict(self), "model": self.model.math_dict()}

    def math_fields(self) -> dict[str, Any]:
        skip = resumable(type(self)) | not_in_use(self)
        return {k: v for k, v in self.to_dict().items() if k not in skip}

    def math_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.math_fields(), sort_keys=True).encode()).hexdigest()[:16]


assert TrainConfig.__bases__[2:] == SHARED_PARTS[::-1], "TrainConfig's bases are the shared parts"


def math_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Keys (dotted) whose values differ between two ``math_fields`` dicts."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict) and key == "model":
            out += [f"model.{k}" for k in math_diff(a, b)]
        elif a != b:
            out.append(key)
    return out
