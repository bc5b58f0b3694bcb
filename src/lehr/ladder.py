"""The model ladder: a few model sizes, each one stable run that keeps a branch point at every
token budget and one short cooldown from each, so that one run per size gives fully annealed
models at every budget (Hagele et al. 2024). The endpoints' held-out losses are what
``lehr.scaling_fit`` fits a scaling law to.

Kedro-free: the ladder's stages (``ladder_rung``, ``ladder_fit``) are thin glue over it, and a
test runs a micro ladder through it directly.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path

from lehr.config_parts import Part, Section, require, require_positive
from lehr.params import AnnealParams, ModelParams, PretrainParams
from lehr.training import anneal_job, run_engine, stable_job


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShapeRule(Part):
    """One knob per rung, its depth; the rest of the shape follows: width = aspect_ratio x depth,
    heads of head_dim each, SwiGLU's d_ff = 8/3 x width rounded up to a multiple of 16, and one
    context length for every rung (the preset gives everything else, e.g. QK-norm)."""

    preset: str
    aspect_ratio: int
    head_dim: int
    seq_len: int

    def check(self) -> None:
        require_positive(self, "aspect_ratio", "head_dim", "seq_len")
        require(self.head_dim % 2 == 0, "head_dim", self.head_dim, "must be even (RoPE rotates pairs)")

    def of(self, depth: int) -> dict:
        width = self.aspect_ratio * depth
        require(
            width % self.head_dim == 0,
            "ladder.shape.head_dim",
            self.head_dim,
            f"does not divide the width of depth {depth} (aspect_ratio {self.aspect_ratio} x {depth} = "
            f"{width}): choose a head_dim that divides aspect_ratio, or an aspect_ratio it divides",
        )
        d_ff = 16 * math.ceil(8 * width / 3 / 16)
        return dict(
            n_layer=depth, d_model=width, n_head=width // self.head_dim, d_ff=d_ff, seq_len=self.seq_len
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class LadderParams(Section):
    sizes: list[int]  # each rung's depth; DVC makes one stage per size
    rung: int  # the size `kedro run --pipeline ladder_rung` trains (its DVC stage sets it); 0 = none
    shape: ShapeRule
    budgets: list[int]  # token counts of every rung's branch points, each cooled down from
    decay_ratio: float  # each cooldown's length, of the steps before its branch point
    flop_budgets: list[float]  # compute budgets (FLOPs) to report N*, D* and tokens per parameter at
    bootstrap: int  # refits to resampled endpoints, for the intervals
    SECTION: typing.ClassVar[str] = "ladder"

    def check(self) -> None:
        require(
            bool(self.sizes) and all(isinstance(s, int) and s > 0 for s in self.sizes),
            "sizes",
            self.sizes,
            "must be a list of positive depths, e.g. [2, 3, 4, 5]",
        )
        require(
            len(self.budgets) >= 1 and all(isinstance(b, int) and b > 0 for b in self.budgets),
            "budgets",
            self.budgets,
            "must be a list of positive token counts",
        )
        require(
            0 < self.decay_ratio <= 1, "decay_ratio", self.decay_ratio, "must lie in (0, 1] (0.2 is usual)"
        )
        require(self.bootstrap >= 0, "bootstrap", self.bootstrap, "must be >= 0 (0 = no intervals)")
        for depth in self.sizes:
            self.shape.of(depth)  # every rung's shape is checked before any trains


def rung_params(p: PretrainParams, a: AnnealParams, ladder: LadderParams, depth: int, manifest: dict):
    """The stable phase and the cooldown recipe of the rung of ``depth``: the project's recipe at
    that shape, planned to end at the largest budget, with a branch point at each other one."""
    per_step = p.batch_size * ladder.shape.seq_len
    budgets = sorted(set(ladder.budgets))
    _check_budgets(p, ladder, budgets, per_step, manifest)
    last = budgets[-1] // per_step
    decay = max(1, round(ladder.decay_ratio * last))
    stable = dataclasses.replace(
        p,
        run_name="",  # keyed by the rung's config, so that every size and recipe has its own run
        model=ModelParams(preset=ladder.shape.preset, overrides=ladder.shape.of(depth)),
        planned_steps=last + decay,
        planned_decay_fraction=decay / (last + decay),
        branch_points=budgets[:-1],
        auto_anneal=dataclasses.replace(p.auto_anneal, enabled=False),
    )
    cooldown = dataclasses.replace(a, decay_steps=0, decay_ratio=ladder.decay_ratio, patience=0)
    return stable, cooldown


def _check_budgets(
    p: PretrainParams, ladder: LadderParams, budgets: list[int], per_step: int, manifest: dict
) -> None:
    train_tokens = sum(s["n_tokens"] for s in manifest["streams"].values() if s["split"] == "train")
    for b in budgets:
        require(
            b % per_step == 0,
            "ladder.budgets",
            b,
            f"is not a whole number of steps of {per_step} tokens (pretrain.batch_size {p.batch_size} x "
            f"ladder.shape.seq_len {ladder.shape.seq_len}): use {b // per_step * per_step or per_step}",
        )
    seen = budgets[-1] * (1 + ladder.decay_ratio)
    require(
        seen <= train_tokens * p.max_epochs_warn,
        "ladder.budgets",
        budgets[-1],
        f"with its cooldown trains {seen:,.0f} tokens, more than the corpus's {train_tokens:,} training "
        f"tokens repeated pretrain.max_epochs_warn = {p.max_epochs_warn} times: lower the budget or "
        "bring more text",
    )


def train_rung(p, a, ladder: LadderParams, depth: int, shards: dict, runs_root: Path, tasks: dict) -> dict:
    """Train one rung (resuming whatever an earlier attempt left) and return its endpoints: the
    held-out loss and bits per byte of each cooldown's end, with its tokens and FLOPs."""
    stable_p, cooldown = rung_params(p, a, ladder, depth, shards)
    stable = run_engine(stable_job(stable_p, shards, runs_root, tasks), stable_p)
    origins = {**stable["branch_points"], "pre_anneal": stable["pre_anneal"]}
    endpoints = []
    for origin, path in sorted(origins.items(), key=lambda kv: kv[1]):
        branch = dataclasses.replace(cooldown, branch=f"{origin}-cooldown", origin=origin)
        cfg, _ = anneal_job(stable_p, branch, shards, Path(path), runs_root, tasks)
        end = run_engine(cfg, stable_p)
        held = end["heldout"]["heldout"]
        endpoints.append(
            {
                "origin": origin,
                "steps": end["step"],
                "tokens": end["tokens"],
                "loss": held["loss"],
                "bpb": held["bpb"],
                "flops": end["flops_per_token"] * end["tokens"],
            }
        )
    return {
        "depth": depth,
        "shape": ladder.shape.of(depth),
        "n_params": stable["n_params"],
        "flops_per_token": stable["flops_per_token"],
        "lr": stable_p.lr,
        "muon_lr": stable_p.muon_lr,
        "endpoints": sorted(endpoints, key=lambda e: e["tokens"]),
    }
