"""Typed stage parameters of the training stages (the data stages' are in ``lehr.dataprep.params``).
Each class mirrors one key of ``conf/base/parameters_<stage>.yml``.

Kedro turns the YAML mapping into these frozen dataclasses before any node runs (a node input
typed as a dataclass is validated by Kedro), so an unknown key, a wrong type or an out-of-range
value stops the run with the key named and nothing written. The training settings are the
engine's own config parts (``lehr.engine.config``), inherited here rather than declared again.
"""

from __future__ import annotations

import dataclasses
import typing

from lehr.config_parts import Part, Section, require, require_positive, setting
from lehr.dataprep.params import ShardParams, TokenizeParams
from lehr.engine.config import (
    SHARED_PARTS,
    BranchConfig,
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    GuardConfig,
    HardwareConfig,
    Launch,
    OptimizerConfig,
    ScheduleConfig,
)
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
    min_fraction: float  # of planned_steps: never start the decay earlier
    max_fraction: float  # of planned_steps: nor later (the stable phase may extend up to here)
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
class PretrainParams(
    Section,
    # SHARED_PARTS reversed, written out for the type checker (the assert below holds them together)
    GuardConfig,
    CheckpointConfig,
    EvalConfig,
    HardwareConfig,
    DataConfig,
    OptimizerConfig,
    ScheduleConfig,
):
    """The stable phase: the engine's shared parts (schedule, optimizer, data, hardware, eval,
    checkpointing, guard; see ``lehr.engine.config``) plus what only the stage decides."""

    run_name: str  # data/06_models/stable_run/<run_name>; "" = a folder keyed by the run's config and data
    model: ModelParams
    # Of planned_steps: the stable phase is planned to end at (1 - this) * planned_steps (auto-anneal may
    # move it). The anneal's own decay length is anneal.decay_steps / anneal.decay_fraction.
    planned_decay_fraction: float = setting(renamed_from="decay_fraction")
    # Token counts at which the stable phase keeps a checkpoint to branch an anneal from
    # (anneal.origin: tokens-<N>); each a whole number of steps, within the stable phase.
    branch_points: list[int]
    auto_anneal: AutoAnnealParams
    launch: Launch
    SECTION: typing.ClassVar[str] = "pretrain"

    def check(self) -> None:
        require(
            0 < self.planned_decay_fraction < 1,
            "planned_decay_fraction",
            self.planned_decay_fraction,
            "must lie in (0, 1)",
        )
        require_folder_name("run_name", self.run_name)
        require(
            all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in self.branch_points),
            "branch_points",
            self.branch_points,
            "must be a list of positive token counts, e.g. [1024000, 2048000]",
        )

    @property
    def planned_anneal_step(self) -> int:
        return int(round(self.planned_steps * (1 - self.planned_decay_fraction)))


assert PretrainParams.__bases__[1:] == SHARED_PARTS[::-1], "PretrainParams' bases are the shared parts"


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnnealParams(Section, BranchConfig):
    """One anneal branch: the engine's branch settings (``BranchConfig``: its decay, data mix,
    fresh data seed and early stop) and the folder it trains into."""

    branch: str  # the branch's folder ("" = derived from these params), in its home (docs/tracking.md)
    # What the branch starts from: pre_anneal (the stable phase's end) or one of its branch points,
    # tokens-<N> for each N in pretrain.branch_points. Came after branches had names.
    origin: str = setting(off="pre_anneal")
    SECTION: typing.ClassVar[str] = "anneal"

    def check(self) -> None:
        require_folder_name("branch", self.branch)
        require_folder_name("origin", self.origin)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvaluateParams(Section):
    # The models scored besides pre_anneal and the current branch: all = every branch and soup in
    # data/06_models/anneal; [] = none; or names (a+b on the command line).
    branches: list[str] | str
    eval_windows: int  # held-out windows per source (more than during training: a final figure)
    sample_prompt: str
    sample_tokens: int
    # A scored branch every other model is compared with, per source and task, with paired 95%
    # intervals (metrics.json: vs_baseline); "" = none.
    baseline: str
    tasks: list[str] | str = (
        "all"  # task files to score every model on: all, or names (built-in and user); or a+b
    )
    SECTION: typing.ClassVar[str] = "evaluate"

    def check(self) -> None:
        object.__setattr__(self, "branches", names(self.branches))
        object.__setattr__(self, "tasks", names(self.tasks))
        require_positive(self, "eval_windows")
        require_folder_name("baseline", self.baseline)


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
