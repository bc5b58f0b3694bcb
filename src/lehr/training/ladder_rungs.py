"""The model ladder: a few model sizes, each one stable run that keeps a branch point at every
token budget and one short cooldown from each, so that one run per size gives fully annealed
models at every budget (Hagele et al. 2024). The endpoints' held-out losses are what
``lehr.reports.scaling_fit`` fits a scaling law to.

Kedro-free: the ladder's stages (``ladder_rung``, ``ladder_fit``) are thin glue over it, and a
test runs a micro ladder through it directly.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from lehr.config_parts import require
from lehr.engine.model import preset
from lehr.engine.schedule import cooldown_steps
from lehr.params.ladder import LadderParams, ShapeRule
from lehr.params.stages import AnnealParams, ModelParams, PretrainParams
from lehr.training.job import anneal_job, run_engine, stable_job


def rung_params(p: PretrainParams, a: AnnealParams, ladder: LadderParams, depth: int, manifest: dict):
    """The stable phase and the cooldown recipe of the rung of ``depth``: the project's recipe at
    that shape (its model overrides too, e.g. the residual scalars), planned to end at the largest
    budget, with a branch point at each other one."""
    per_step = p.batch_size * ladder.shape.seq_len
    budgets = sorted(set(ladder.budgets))
    _check_budgets(p, ladder, budgets, per_step, manifest)
    last = budgets[-1] // per_step
    decay = cooldown_steps(ladder.decay_ratio, last)
    stable = dataclasses.replace(
        p,
        run_name="",  # keyed by the rung's config, so that every size and recipe has its own run
        model=ModelParams(
            preset=ladder.shape.preset, overrides={**p.model.overrides, **ladder.shape.of(depth)}
        ),
        planned_steps=last + decay,
        planned_decay_fraction=decay / (last + decay),
        branch_points=budgets[:-1],
        auto_anneal=dataclasses.replace(p.auto_anneal, enabled=False),
        # Every rung draws batch_size sequences from its first step, so that its budgets are whole
        # steps: a recipe's batch-size warmup stays off the ladder, and `lehr ladder predict
        # --checkpoint` names a run with one an extrapolation (``family_gaps``).
        batch_warmup_steps=0,
    )
    cooldown = dataclasses.replace(a, decay_steps=0, decay_ratio=ladder.decay_ratio, patience=0)
    return stable, cooldown


def recipe_overrides(p: PretrainParams, ladder: LadderParams) -> dict:
    """The recipe's model overrides that reach every rung: those the shape rule does not set."""
    shaped = ladder.shape.of(ladder.sizes[0]).keys()
    return {k: v for k, v in p.model.overrides.items() if k not in shaped}


def family_gaps(
    family: dict, model: dict, decay: tuple[int, int] | None = None, batch_warmup_steps: int = 0
) -> list[str]:
    """How a model (its math dict) and its anneal (decay start and steps) lie outside the ladder's
    ``family``; none for a member, where the law interpolates between rungs of its own kind. (A fit
    made before rungs took the recipe's model overrides records none: its rungs had none.)"""
    rule, depths, depth = ShapeRule(**family["shape"]), family["depths"], model["n_layer"]
    shape = {**family.get("overrides", {}), **rule.of(depth)}
    member = preset(rule.preset, model["vocab_size"], **shape).math_dict()
    gaps = [
        f"{key} {model.get(key)} where the family's model of depth {depth} has {member.get(key)}"
        for key in sorted(member.keys() | model.keys())
        if member.get(key) != model.get(key)
    ]
    if not min(depths) <= depth <= max(depths):
        gaps.append(f"depth {depth}, outside the rungs' {min(depths)} to {max(depths)}")
    if decay is None:
        gaps.append("not annealed (a stable phase's checkpoint), where every rung's endpoint is")
    else:
        start, steps = decay
        if steps != cooldown_steps(family["decay_ratio"], start):  # a rung's rule (``rung_params``)
            gaps.append(
                f"an anneal of {steps} steps after {start} ({steps / start:.2f} of them) where each rung "
                f"cools down {family['decay_ratio']} of the steps before it"
            )
    if batch_warmup_steps:  # off on every rung (``rung_params``)
        gaps.append(f"a batch-size warmup over its first {batch_warmup_steps} steps, where no rung has one")
    return gaps


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
        "overrides": recipe_overrides(p, ladder),
        "n_params": stable["n_params"],
        "flops_per_token": stable["flops_per_token"],
        "lr": stable_p.lr,
        "muon_lr": stable_p.muon_lr,
        "endpoints": sorted(endpoints, key=lambda e: e["tokens"]),
    }
