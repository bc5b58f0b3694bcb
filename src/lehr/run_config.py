"""Stage params -> the engine's ``TrainConfig`` (``lehr.training`` runs it). The params already
hold the engine's config parts (``lehr.params``); what is computed here is only what derives
from several settings or from the data: the model for the tokenizer's vocabulary, the stop rule,
the branch's decay, the run folders."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from lehr.engine.config import SHARED_PARTS, StopRule, TrainConfig
from lehr.engine.model import ModelConfig, preset
from lehr.params import AnnealParams, PretrainParams
from lehr.project import portable


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


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:8]


def stable_config(
    p: PretrainParams, manifest: dict, runs_root: Path, provenance: dict, tasks: dict | None = None
) -> TrainConfig:
    """Warmup + stable LR until the anneal start (planned, or decided by auto-anneal).

    The rolling checkpoints go to ``runs_root/<run_name>``; with no run name, to a folder keyed by
    everything that shapes the run (math, stop rule, budget, data), so a `dvc exp run` with other
    stable params starts its own run instead of tripping over another's checkpoints, and the same
    params resume. A pinned run name resumes only under the config that made it (the engine's rule).
    """
    aa = p.auto_anneal
    rule = StopRule(
        planned_step=p.planned_anneal_step,
        # Rounded, not truncated: 700 * 0.7 is 489.99999999999994 in floating point.
        min_step=round(p.total_steps * aa.min_fraction),
        max_step=round(p.total_steps * aa.max_fraction),
        auto=aa.enabled and p.schedule == "wsd",  # the cosine baseline stops where planned: equal tokens
        stall_window=aa.stall_window,
        stall_eps=aa.stall_eps,
        save_to="",
    )
    cfg = TrainConfig(**_shared(p, manifest, runs_root, provenance, tasks or {}), stop_rule=rule)
    name = p.run_name or "auto-" + _key(
        cfg.math_fields(), vars(rule), p.total_steps, provenance["manifest_sha256"]
    )
    run_dir = Path(portable(runs_root / name))
    return dataclasses.replace(
        cfg, out_dir=str(run_dir), stop_rule=dataclasses.replace(rule, save_to=str(run_dir / "pre_anneal"))
    )


def decay_steps(p: PretrainParams, a: AnnealParams) -> int:
    return a.decay_steps or max(1, round(a.decay_fraction * p.total_steps))


def anneal_run_dir(runs_root: Path, branch: str, pre_anneal: Path) -> Path:
    """A branch's rolling checkpoints, keyed by the ``pre_anneal`` it grew from: after a new stable
    phase the branch starts afresh from the new branch point instead of resuming the old one."""
    files = json.loads((pre_anneal / "state.json").read_text())["files"]  # sha256 of weights, optimizer, RNG
    return runs_root / f"{branch}-{_key(files)}"


def branch_name(p: PretrainParams, a: AnnealParams) -> str:
    """``anneal.branch``, or a name derived from the params that shape the anneal."""
    if a.branch:
        return a.branch
    shaping = {k: v for k, v in vars(a).items() if k != "branch"} | {"schedule": p.schedule}
    digest = hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:6]
    kind = "cosine" if p.schedule == "cosine" else a.shape
    return f"{kind}-{decay_steps(p, a)}-{digest}"


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
    state = json.loads((pre_anneal / "state.json").read_text())
    start = state["progress"]["step"]
    length = decay_steps(p, a)
    # The cosine baseline spends exactly the nominal budget, like WSD's planned stable + decay.
    end = p.total_steps if p.schedule == "cosine" else start + length
    _check_same_profile(state, model_config(p, manifest), provenance, pre_anneal)
    shared = _shared(p, manifest, run_dir, provenance, tasks or {}) | dict(
        data_seed=a.data_seed, eval_every=a.eval_every, min_lr=a.min_lr if p.schedule == "wsd" else p.min_lr
    )
    return TrainConfig(
        **shared,
        anneal_mix=a.mix,
        anneal_start=start,
        anneal_steps=end - start,
        decay_shape=a.shape,
        end_step=end,
        init_from=portable(pre_anneal),
        init_optimizer=a.init_optimizer,
        patience=a.patience,
        patience_from_step=start + (end - start) // 2,
    )


def _check_same_profile(state: dict, model: ModelConfig, provenance: dict, pre_anneal: Path) -> None:
    """A branch needs the model ``pre_anneal`` was trained as; when it differs because the two runs
    are under different profiles, say so and name the profile to use."""
    theirs, ours = state.get("provenance", {}).get("profile"), provenance.get("profile")
    if theirs and ours and theirs != ours and state["config"]["model"] != model.math_dict():
        raise ValueError(
            f"refusing to branch from {pre_anneal}: it was made under the {theirs} profile, and this run "
            "is under "
            f"{ours}, whose model differs. Run the anneal under the same profile (`kedro run --pipeline "
            "anneal "
            f"--env {theirs}`), or train pre_anneal under {ours} first (`kedro run --pipeline "
            "pretrain_stable "
            f"--env {ours}`). The profile `dvc repro` and a bare `kedro run` use is the one in "
            "conf/profile.yaml."
        )
