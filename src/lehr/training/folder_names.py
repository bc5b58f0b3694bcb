"""What the training stages' folders are called: the stable run's, a branch's, and a branch's
rolling run. Each name is either the one the params give or a digest of what shapes the run, so
runs of other settings never share a folder and the same settings find their own again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lehr.config_parts import not_in_use
from lehr.engine.artifacts.state import State
from lehr.engine.config import StopRule, TrainConfig
from lehr.params.stages import AnnealParams, PretrainParams


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:8]


def stable_run_name(p: PretrainParams, cfg: TrainConfig, rule: StopRule, manifest_sha256: str) -> str:
    """``pretrain.run_name``, or ``auto-`` and a key of everything that shapes the stable run
    (math, stop rule, budget, data)."""
    return p.run_name or "auto-" + _key(cfg.math_fields(), vars(rule), p.planned_steps, manifest_sha256)


def anneal_run_dir(runs_root: Path, branch: str, pre_anneal: Path) -> Path:
    """A branch's rolling checkpoints, keyed by the ``pre_anneal`` it grew from: after a new stable
    phase the branch starts afresh from the new branch point instead of resuming the old one."""
    files = State.read(pre_anneal).files  # sha256 of weights, optimizer, RNG
    return runs_root / f"{branch}-{_key(files)}"


def branch_name(p: PretrainParams, a: AnnealParams) -> str:
    """``anneal.branch``, or a name derived from the params that shape the anneal."""
    if a.branch:
        return a.branch
    # A setting at its "not in use" value is left out, so that a branch named before the setting
    # existed keeps its name (and metrics.json its keys).
    shaping = {k: v for k, v in vars(a).items() if k != "branch" and k not in not_in_use(a)}
    digest = hashlib.sha256(
        json.dumps(shaping | {"schedule": p.schedule}, sort_keys=True).encode()
    ).hexdigest()
    kind = "cosine" if p.schedule == "cosine" else a.shape
    length = f"r{a.decay_ratio:g}" if a.decay_ratio else str(a.length(p.planned_steps, 0))
    name = f"{kind}-{length}-{digest[:6]}"
    return name if a.origin == "pre_anneal" else f"{a.origin}-{name}"
