"""Typed stage parameters of the training stages (the data stages' are in ``lehr.data.params``).
Each class mirrors one key of ``conf/base/parameters_<stage>.yml``.

Kedro turns the YAML mapping into these frozen dataclasses before any node runs (a node input
typed as a dataclass is validated by Kedro), so an unknown key, a wrong type or an out-of-range
value stops the run with the key named and nothing written. The training settings are the
engine's own config parts (``lehr.engine.config``), inherited here rather than declared again.
"""

from __future__ import annotations

import dataclasses
import typing

from lehr.data.params import ShardParams, TokenizeParams
from lehr.engine.config import SHARED_PARTS, Launch
from lehr.engine.parts import Part, Section, check_mix, from_mapping, require, require_positive, require_seed
from lehr.files.names import RULE, is_folder_name


def require_folder_name(key: str, value: str) -> None:
    """A name that becomes a folder; "" leaves the name to lehr."""
    require(value == "" or is_folder_name(value), key, value, RULE)


def names(value: list[str] | str) -> list[str]:
    """A list of names from YAML, or ``a+b`` from the command line (Kedro's --params splits on commas)."""
    return [n for n in value.split("+") if n] if isinstance(value, str) else list(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelParams(Part):
    preset: str  # tiny | cpu-demo | gpt2-small
    overrides: dict  # any ModelConfig field, e.g. {seq_len: 256, qk_norm: true}
    vocab_size: int | None = None  # None = the tokenizer's; set it only to assert a value


@dataclasses.dataclass(frozen=True, kw_only=True)
class AutoAnnealParams(Part):
    enabled: bool  # start the decay when the held-out curve stalls, within the bounds below
    min_fraction: float  # of total_steps: never start the decay earlier
    max_fraction: float  # of total_steps: nor later (the stable phase may extend up to here)
    stall_window: int  # evals compared, best of the newer half vs the older half
    stall_eps: float  # nats per token; a smaller gain counts as a stall

    def check(self) -> None:
        require(
            0 < self.min_fraction <= self.max_fraction < 1,
            "min_fraction",
            self.min_fraction,
            f"and max_fraction = {self.max_fraction} must satisfy 0 < min_fraction <= max_fraction < 1",
        )
        require(self.stall_window >= 2, "stall_window", self.stall_window, "must be at least 2")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainParams(Section, *reversed(SHARED_PARTS)):
    """The stable phase: the engine's shared parts (schedule, optimizer, data, hardware, eval,
    checkpointing, guard; see ``lehr.engine.config``) plus what only the stage decides."""

    run_name: str  # data/06_models/stable_run/<run_name>; "" = a folder keyed by the run's config and data
    model: ModelParams
    decay_fraction: float  # of total_steps spent decaying; the planned anneal starts at 1 - this
    auto_anneal: AutoAnnealParams
    launch: Launch
    SECTION: typing.ClassVar[str] = "pretrain"

    def check(self) -> None:
        require(0 < self.decay_fraction < 1, "decay_fraction", self.decay_fraction, "must lie in (0, 1)")
        require_folder_name("run_name", self.run_name)

    @property
    def planned_anneal_step(self) -> int:
        return int(round(self.total_steps * (1 - self.decay_fraction)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnnealParams(Section):
    """One anneal branch. Its settings are the branch's own (a fresh data seed, the decay's floor):
    ``run_config`` turns them into the engine's decay and data parts."""

    branch: str  # folder under data/06_models/anneal; "" = derived from these params
    decay_steps: int  # decay length in steps; 0 = decay_fraction of pretrain.total_steps
    decay_fraction: float  # used when decay_steps is 0
    shape: typing.Literal["linear", "cosine", "1-sqrt"]
    min_lr: float  # learning rate at the end of the decay
    mix: list  # [[end_fraction, {tier: weight}], ...] phases over the decay; [[1.0, {gold: 1}]] = gold only
    data_seed: int  # a fresh seed, so the anneal does not replay the stable windows
    init_optimizer: bool  # carry the optimizer's state over (AdamW's moments, Muon's momentum)
    patience: int  # evals without a new best before an early stop; 0 = off
    eval_every: int  # steps
    SECTION: typing.ClassVar[str] = "anneal"

    def check(self) -> None:
        require(self.decay_steps >= 0, "decay_steps", self.decay_steps, "must be >= 0")
        require(0 < self.decay_fraction < 1, "decay_fraction", self.decay_fraction, "must lie in (0, 1)")
        require(self.min_lr >= 0, "min_lr", self.min_lr, "must be >= 0")
        require(
            bool(self.mix)
            and all(
                isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[1], dict) for p in self.mix
            ),
            "mix",
            self.mix,
            "must be a list of [end_fraction, {tier: weight}] pairs",
        )
        ends = [p[0] for p in self.mix]
        require(
            all(isinstance(e, (int, float)) and not isinstance(e, bool) and 0 < e <= 1 for e in ends)
            and ends == sorted(ends)
            and len(set(ends)) == len(ends),
            "mix",
            self.mix,
            f"has phase end fractions {ends}: they must rise strictly within (0, 1], "
            f"e.g. [[0.5, {{silver: 1}}], [1.0, {{gold: 1}}]]",
        )
        for i, (_, weights) in enumerate(self.mix):
            check_mix(weights, f"mix[{i}]")
        require_seed("data_seed", self.data_seed)
        require_folder_name("branch", self.branch)
        require(self.patience >= 0, "patience", self.patience, "must be >= 0 (0 = off)")
        require_positive(self, "eval_every")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvaluateParams(Section):
    # The models scored besides pre_anneal and the current branch: all = every branch and soup in
    # data/06_models/anneal; [] = none; or names (a+b on the command line).
    branches: list[str] | str
    eval_windows: int  # held-out windows per source (more than during training: a final figure)
    sample_prompt: str
    sample_tokens: int
    tasks: list[str] | str = (
        "all"  # task files to score every model on: all, or names (built-in and user); or a+b
    )
    SECTION: typing.ClassVar[str] = "evaluate"

    def check(self) -> None:
        object.__setattr__(self, "branches", names(self.branches))
        object.__setattr__(self, "tasks", names(self.tasks))
        require_positive(self, "eval_windows")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoupParams(Section):
    branches: list[str] | str  # anneal branches whose final weights are averaged; or a+b on the command line
    name: str  # the new branch's name; "" = soup-<branches joined by ->
    SECTION: typing.ClassVar[str] = "soup"

    def check(self) -> None:
        object.__setattr__(self, "branches", names(self.branches))
        require_folder_name("name", self.name)
        for branch in self.branches:
            require_folder_name("branches", branch)


SECTIONS = {
    "tokenize": TokenizeParams,
    "shard": ShardParams,
    "pretrain": PretrainParams,
    "anneal": AnnealParams,
    "evaluate": EvaluateParams,
    "soup": SoupParams,
}


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
