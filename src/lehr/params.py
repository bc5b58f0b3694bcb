"""Typed stage parameters. Each class mirrors one key of ``conf/base/parameters_<stage>.yml``.

Kedro turns the YAML mapping into these frozen dataclasses before any node runs (a node input
typed as a dataclass is validated by Kedro), so an unknown key, a wrong type or an out-of-range
value stops the run with the key named and nothing written.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

from lehr.token_store import parse_slice


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict)
    if dataclasses.is_dataclass(hint):
        return isinstance(value, (hint, dict))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    return isinstance(value, hint)


def check_fields(obj: Any, section: str) -> None:
    """Type-check every field of a params dataclass; nested dicts become their dataclasses."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, hint = getattr(obj, f.name), hints[f.name]
        if not _type_ok(value, hint):
            raise ValueError(
                f"parameter {section}.{f.name} = {value!r} has the wrong type: expected {hint}"
                .replace("typing.", "")
            )
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            object.__setattr__(obj, f.name, from_mapping(hint, value, f"{section}.{f.name}"))


def from_mapping(cls: type, mapping: dict, section: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(mapping) - known)
    if unknown:
        raise ValueError(
            f"unknown parameter {section}.{unknown[0]}; the keys of {section} are: {', '.join(sorted(known))}"
        )
    return cls(**mapping)


def names(value: list[str] | str) -> list[str]:
    """A list of names from YAML, or ``a+b`` from the command line (Kedro's --params splits on commas)."""
    return [n for n in value.split("+") if n] if isinstance(value, str) else list(value)


def require(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def check_mix(mix: object, key: str) -> None:
    """A data mix: a non-empty {tier: weight} with every weight a positive number (leave a tier out
    rather than give it 0)."""
    require(isinstance(mix, dict) and bool(mix), f"parameter {key} must be a mapping of tier: weight, e.g. {{gold: 1.0}}")
    for tier, weight in mix.items():
        ok = isinstance(weight, (int, float)) and not isinstance(weight, bool) and weight > 0 and weight == weight
        require(ok, f"parameter {key}.{tier} = {weight!r} must be a positive number (leave a tier out to not use it)")


SEED_LIMIT = 2**32  # numpy's generators take seeds below this


@dataclasses.dataclass(frozen=True)
class TokenizeParams:
    vocab_size: int  # tokens in the BPE vocabulary, special tokens included
    special_tokens: list[str]  # the first must be <|endoftext|>, the document separator
    train_sample_bytes: int  # UTF-8 bytes of training text used to fit BPE; 0 = all
    min_frequency: int  # a pair merges only if it occurs at least this often
    batch_size: int  # documents per encode_batch call
    max_bytes_per_stream: int  # cap per stream for quick runs (smoke); 0 = no cap
    on_decode_error: typing.Literal["error", "replace"]  # non-UTF-8 input: stop, or U+FFFD
    text_field: str = "text"  # the JSONL field / parquet column that holds a document's text
    workers: int = 0  # encoding processes; 0 = one per core
    slice: str = "1/1"  # i/N: encode every N-th file from the i-th (one machine of N); the shard stage merges

    def __post_init__(self) -> None:
        check_fields(self, "tokenize")
        floor = 256 + len(self.special_tokens)
        require(
            floor < self.vocab_size <= 1_000_000,
            f"parameter tokenize.vocab_size = {self.vocab_size} is out of range: it must exceed the "
            f"256 byte tokens plus {len(self.special_tokens)} special tokens ({floor}) and be at most 1000000",
        )
        require(self.special_tokens[:1] == ["<|endoftext|>"],
                "parameter tokenize.special_tokens must start with <|endoftext|>")
        require(self.batch_size > 0, "parameter tokenize.batch_size must be positive")
        require(self.workers >= 0, f"parameter tokenize.workers = {self.workers} must be >= 0 (0 = one per core)")
        require(bool(self.text_field), "parameter tokenize.text_field must name a field")
        parse_slice(self.slice)


@dataclasses.dataclass(frozen=True)
class ShardParams:
    shard_tokens: int  # tokens per shard file (the last shard of a stream may be shorter)

    def __post_init__(self) -> None:
        check_fields(self, "shard")
        require(self.shard_tokens > 0, "parameter shard.shard_tokens must be positive")


@dataclasses.dataclass(frozen=True)
class ModelParams:
    preset: str  # tiny | cpu-demo | gpt2-small
    overrides: dict  # any ModelConfig field, e.g. {seq_len: 256, qk_norm: true}
    vocab_size: int | None = None  # None = the tokenizer's; set it only to assert a value

    def __post_init__(self) -> None:
        check_fields(self, "pretrain.model")


@dataclasses.dataclass(frozen=True)
class AutoAnnealParams:
    enabled: bool  # start the decay when the held-out curve stalls, within the bounds below
    min_fraction: float  # of total_steps: never start the decay earlier
    max_fraction: float  # of total_steps: nor later (the stable phase may extend up to here)
    stall_window: int  # evals compared, best of the newer half vs the older half
    stall_eps: float  # nats per token; a smaller gain counts as a stall

    def __post_init__(self) -> None:
        check_fields(self, "pretrain.auto_anneal")
        require(0 < self.min_fraction <= self.max_fraction < 1,
                "pretrain.auto_anneal needs 0 < min_fraction <= max_fraction < 1")
        require(self.stall_window >= 2, "pretrain.auto_anneal.stall_window must be at least 2")


@dataclasses.dataclass(frozen=True)
class LaunchParams:
    nproc_per_node: int  # processes on this machine; 1 = in-process
    nnodes: int  # machines; more than 1 needs rdzv_endpoint reachable from all
    node_rank: int
    rdzv_endpoint: str  # host:port of the rendezvous on node 0
    max_restarts: int  # torchrun restarts a failed group this often, resuming from the checkpoint

    def __post_init__(self) -> None:
        check_fields(self, "pretrain.launch")


@dataclasses.dataclass(frozen=True)
class PretrainParams:
    run_name: str  # data/06_models/stable_run/<run_name>; "" = a folder keyed by the run's config and data
    model: ModelParams
    seed: int  # model init
    data_seed: int  # training windows of the stable phase
    batch_size: int  # sequences per optimizer step (all processes, all micro-batches)
    micro_batch: int  # sequences per forward pass per process
    stable_mix: dict  # tier -> sampling weight in the stable phase
    lr: float  # peak learning rate
    min_lr: float  # learning rate at the end of the decay
    warmup_steps: int
    weight_decay: float
    grad_clip: float  # max global grad norm; 0 = off
    schedule: typing.Literal["wsd", "cosine"]  # cosine = the baseline: one warmup + cosine over total_steps
    total_steps: int  # nominal budget in optimizer steps, stable + anneal
    decay_fraction: float  # of total_steps spent decaying; the planned anneal starts at 1 - this
    auto_anneal: AutoAnnealParams
    precision: typing.Literal["auto", "bf16", "fp16", "fp32", "fp8"]  # fp8: torchao, the [fp8] extra
    compile: bool  # torch.compile the training step (GPU)
    attention: typing.Literal["auto", "flash", "efficient", "cudnn", "math"]  # SDPA kernel; auto = PyTorch picks
    device: typing.Literal["auto", "cpu", "cuda"]
    log_every: int  # steps
    eval_every: int  # steps
    eval_windows: int  # fixed held-out windows per source at each eval
    sample_tokens: int  # sampled at each eval; 0 = none
    ckpt_every: int  # steps between rolling checkpoints
    keep_last: int  # rolling checkpoints kept
    max_consecutive_skips: int  # non-finite steps in a row before the run aborts
    max_epochs_warn: float  # warn at start when the run would repeat a tier more often than this
    launch: LaunchParams

    def __post_init__(self) -> None:
        check_fields(self, "pretrain")
        require(self.lr > 0, f"parameter pretrain.lr = {self.lr} must be positive")
        require(0 <= self.min_lr <= self.lr, f"parameter pretrain.min_lr = {self.min_lr} must lie in [0, pretrain.lr]")
        require(self.total_steps > 0, "parameter pretrain.total_steps must be positive")
        require(0 < self.decay_fraction < 1, "parameter pretrain.decay_fraction must lie in (0, 1)")
        for key in ("batch_size", "micro_batch", "log_every", "eval_every", "ckpt_every", "keep_last"):
            require(getattr(self, key) > 0, f"parameter pretrain.{key} must be positive")
        require(self.max_epochs_warn > 0, f"parameter pretrain.max_epochs_warn = {self.max_epochs_warn} must be positive")
        require(self.eval_windows > 0, f"parameter pretrain.eval_windows = {self.eval_windows} must be positive")
        for key in ("seed", "data_seed"):
            value = getattr(self, key)
            require(0 <= value < SEED_LIMIT, f"parameter pretrain.{key} = {value} is out of range: use 0 <= {key} < 2**32")
        check_mix(self.stable_mix, "pretrain.stable_mix")

    @property
    def planned_anneal_step(self) -> int:
        return int(round(self.total_steps * (1 - self.decay_fraction)))


@dataclasses.dataclass(frozen=True)
class AnnealParams:
    branch: str  # folder under data/06_models/anneal; "" = derived from these params
    decay_steps: int  # decay length in steps; 0 = decay_fraction of pretrain.total_steps
    decay_fraction: float  # used when decay_steps is 0
    shape: typing.Literal["linear", "cosine", "1-sqrt"]
    min_lr: float  # learning rate at the end of the decay
    mix: list  # [[end_fraction, {tier: weight}], ...] phases over the decay; [[1.0, {gold: 1}]] = gold only
    data_seed: int  # a fresh seed, so the anneal does not replay the stable windows
    init_optimizer: bool  # carry AdamW moments over from pre_anneal
    patience: int  # evals without a new best before an early stop; 0 = off
    eval_every: int  # steps

    def __post_init__(self) -> None:
        check_fields(self, "anneal")
        require(self.decay_steps >= 0, "parameter anneal.decay_steps must be >= 0")
        require(0 < self.decay_fraction < 1, "parameter anneal.decay_fraction must lie in (0, 1)")
        require(self.min_lr >= 0, "parameter anneal.min_lr must be >= 0")
        require(bool(self.mix) and all(isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[1], dict)
                                       for p in self.mix),
                "parameter anneal.mix must be a list of [end_fraction, {tier: weight}] pairs")
        ends = [p[0] for p in self.mix]
        require(all(isinstance(e, (int, float)) and not isinstance(e, bool) and 0 < e <= 1 for e in ends)
                and ends == sorted(ends) and len(set(ends)) == len(ends),
                f"parameter anneal.mix: the phases' end fractions {ends} must rise strictly within (0, 1], "
                f"e.g. [[0.5, {{silver: 1}}], [1.0, {{gold: 1}}]]")
        for i, (_, weights) in enumerate(self.mix):
            check_mix(weights, f"anneal.mix[{i}]")
        require(0 <= self.data_seed < SEED_LIMIT,
                f"parameter anneal.data_seed = {self.data_seed} is out of range: use 0 <= data_seed < 2**32")
        require(self.branch == "" or self.branch.replace("-", "").replace("_", "").replace(".", "").isalnum(),
                f"parameter anneal.branch = {self.branch!r} must be a plain folder name (letters, digits, - _ .)")
        require(self.eval_every > 0, "parameter anneal.eval_every must be positive")


@dataclasses.dataclass(frozen=True)
class EvaluateParams:
    branches: list[str] | str  # anneal branches to report besides the current one; [all] = every branch; or a+b
    eval_windows: int  # held-out windows per source (more than during training: a final figure)
    sample_prompt: str
    sample_tokens: int

    def __post_init__(self) -> None:
        check_fields(self, "evaluate")
        object.__setattr__(self, "branches", names(self.branches))
        require(self.eval_windows > 0, "parameter evaluate.eval_windows must be positive")


@dataclasses.dataclass(frozen=True)
class SoupParams:
    branches: list[str] | str  # anneal branches whose final weights are averaged; or a+b on the command line
    name: str  # the new branch's name; "" = soup-<branches joined by ->

    def __post_init__(self) -> None:
        check_fields(self, "soup")
        object.__setattr__(self, "branches", names(self.branches))


SECTIONS = {"tokenize": TokenizeParams, "shard": ShardParams, "pretrain": PretrainParams, "anneal": AnnealParams,
            "evaluate": EvaluateParams, "soup": SoupParams}


def check_all(parameters: dict) -> list[str]:
    """Every section of a resolved parameters mapping, validated; returns the problems found."""
    problems = []
    for section, cls in SECTIONS.items():
        if section not in parameters:
            problems.append(f"parameter section {section} is missing")
            continue
        try:
            from_mapping(cls, parameters[section], section)
        except (TypeError, ValueError) as e:
            problems.append(str(e))
    return problems
