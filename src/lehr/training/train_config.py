"""Stage params -> the engine's ``TrainConfig`` (``lehr.training.job`` runs it). The params already
hold the engine's config parts (``lehr.params.stages``); what is computed here is only what derives
from several settings or from the data: the model for the tokenizer's vocabulary, the stop rule,
where a branch starts. The folders they train into are named in ``lehr.training.folder_names``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from lehr.engine.artifacts.state import State
from lehr.engine.config import SHARED_PARTS, StopRule, TrainConfig
from lehr.engine.model import ModelConfig, preset
from lehr.params.stages import AnnealParams, PretrainParams
from lehr.paths import portable
from lehr.training.folder_names import stable_run_name


def model_config(p: PretrainParams, manifest: dict) -> ModelConfig:
    vocab = manifest["tokenizer"]["vocab_size"]
    if p.model.vocab_size is not None and p.model.vocab_size != vocab:
        raise ValueError(
            f"vocab mismatch: pretrain.model.vocab_size = {p.model.vocab_size} but the tokenizer of the "
            "shards "
            f"in {manifest['root']} has {vocab} tokens. Remove pretrain.model.vocab_size (it defaults to the "
            f"tokenizer's) or re-run tokenize with tokenize.vocab_size: {p.model.vocab_size}."
        )
    return preset(p.model.preset, vocab, **p.model.overrides)


def _shared(p: PretrainParams, manifest: dict, out_dir: Path, provenance: dict, tasks: dict) -> dict:
    """The settings a stage run takes from ``pretrain`` as they are: every shared config part."""
    parts = {k: v for part in SHARED_PARTS for k, v in p.part(part).items()}
    # Paths relative to the project: a checkpoint's record is the same in every clone.
    return dict(
        parts,
        task_files={name: portable(path) for name, path in tasks.items()},
        model=model_config(p, manifest),
        shards=portable(manifest["root"]),
        out_dir=portable(out_dir),
        provenance=provenance,
    )


def stable_config(
    p: PretrainParams, manifest: dict, runs_root: Path, provenance: dict, tasks: dict | None = None
) -> TrainConfig:
    """Warmup + stable LR until the anneal start (planned, or decided by auto-anneal).

    The rolling checkpoints go to ``runs_root/<run_name>``; with no run name, to a folder keyed by
    everything that shapes the run (math, stop rule, budget, data), so a `dvc exp run` with other
    stable params starts its own run instead of tripping over another's checkpoints, and the same
    params resume. A pinned run name resumes only under the config that made it (the engine's rule).
    """
    rule = stop_rule(p)
    cfg = TrainConfig(**_shared(p, manifest, runs_root, provenance, tasks or {}), stop_rule=rule)
    # The folder is named by the config's own math hash, so the config is built first and given
    # its folder after (a copy); named before the branch points join the rule: keeping a
    # checkpoint changes no step.
    run_dir = Path(portable(runs_root / stable_run_name(p, cfg, rule, provenance["manifest_sha256"])))
    steps = branch_point_steps(p, cfg.model.seq_len, rule)
    rule = dataclasses.replace(
        rule, save_to=str(run_dir / "pre_anneal"), keep=steps, keep_to=str(run_dir / "branch_points")
    )
    return dataclasses.replace(cfg, out_dir=str(run_dir), stop_rule=rule)


def stop_rule(p: PretrainParams) -> StopRule:
    """Where the stable phase ends: planned, or where auto-anneal decides within its bounds."""
    aa = p.auto_anneal
    return StopRule(
        planned_step=p.planned_anneal_step,
        # Rounded, not truncated: 700 * 0.7 is 489.99999999999994 in floating point.
        min_step=round(p.planned_steps * aa.min_fraction),
        max_step=round(p.planned_steps * aa.max_fraction),
        auto=aa.enabled and p.schedule == "wsd",  # the cosine baseline stops where planned: equal tokens
        stall_window=aa.stall_window,
        stall_eps=aa.stall_eps,
        save_to="",
    )


def branch_point_steps(p: PretrainParams, seq_len: int, rule: StopRule) -> tuple[int, ...]:
    """``pretrain.branch_points`` as steps, each refused unless it is a whole step that the stable
    phase reaches whatever auto-anneal decides."""
    per_step, ramp = p.batch_size * seq_len, p.batch_ramp
    last = rule.min_step if rule.auto else rule.planned_step
    steps = []
    for tokens in p.branch_points:
        step = ramp.steps_in(max(0, tokens) // seq_len)
        if tokens <= 0 or ramp.rows_before(step) * seq_len != tokens:
            nearest = " or ".join(str(ramp.rows_before(s) * seq_len) for s in (step, step + 1) if s > 0)
            warmup = (
                f"; fewer in the first {p.batch_warmup_steps}, the batch-size warmup"
                if p.batch_warmup_steps
                else ""
            )
            raise ValueError(
                f"pretrain.branch_points names {tokens} tokens, not a whole number of steps of {per_step} "
                f"tokens (batch_size {p.batch_size} x seq_len {seq_len}{warmup}): use {nearest}"
            )
        if step > last:
            why = "auto_anneal.min_fraction" if rule.auto else "planned_decay_fraction"
            raise ValueError(
                f"pretrain.branch_points names {tokens} tokens (step {step}), past the stable phase: it "
                f"surely runs to step {last} ({ramp.rows_before(last) * seq_len} tokens; {why} sets it), no "
                "further. Name a smaller count, or lengthen the stable phase (pretrain.planned_steps)."
            )
        steps.append(step)
    return tuple(sorted(set(steps)))


def anneal_config(
    p: PretrainParams,
    a: AnnealParams,
    manifest: dict,
    pre_anneal: Path,
    run_dir: Path,
    provenance: dict,
    tasks: dict | None = None,
) -> TrainConfig:
    """Branch from ``pre_anneal`` and decay (WSD) or finish the cosine (baseline) on the anneal mix."""
    state = State.read(pre_anneal)
    _check_same_profile(state, model_config(p, manifest), provenance, pre_anneal)
    stable = TrainConfig(**_shared(p, manifest, run_dir, provenance, tasks or {}))
    return stable.branch(a, state.step, portable(pre_anneal))


def _check_same_profile(state: State, model: ModelConfig, provenance: dict, pre_anneal: Path) -> None:
    """A branch needs the model ``pre_anneal`` was trained as; when it differs because the two runs
    are under different profiles, say so and name the profile to use."""
    theirs, ours = state.provenance.get("profile"), provenance.get("profile")
    if theirs and ours and theirs != ours and state.config["model"] != model.math_dict():
        raise ValueError(
            f"refusing to branch from {pre_anneal}: it was made under the {theirs} profile, and this run "
            "is under "
            f"{ours}, whose model differs. Run the anneal under the same profile (`kedro run --pipelines "
            "anneal "
            f"--env {theirs}`), or train pre_anneal under {ours} first (`kedro run --pipelines "
            "pretrain_stable "
            f"--env {ours}`). The profile `dvc repro` and a bare `kedro run` use is the one in "
            "conf/profile.yaml."
        )
