"""pretrain-stable: warmup + stable LR until the anneal start, then hand on ``pre_anneal``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lehr import provenance, tracking
from lehr.engine import distributed
from lehr.params import PretrainParams
from lehr.run_config import stable_config


def launch_of(p: PretrainParams) -> distributed.Launch:
    return distributed.Launch(**vars(p.launch))


def train_stable(shards: dict, run_dir: Path, params: PretrainParams) -> tuple[Path, dict]:
    cfg = stable_config(params, shards, run_dir / params.run_name, provenance.collect("pretrain-stable", shards))
    summary = distributed.run(cfg.to_dict(), launch_of(params), [tracking.CALLBACK], tracking.current_run_env())
    return Path(summary["pre_anneal"]), summary


def read_curve(run_dir: Path) -> pd.DataFrame:
    """The run's metrics.jsonl as a table (DVC plots and the evaluate stage read it)."""
    frame = pd.read_json(run_dir / "metrics.jsonl", lines=True)
    return frame.drop(columns=[c for c in ("sample", "mem") if c in frame.columns])


def summarize_stable(summary: dict) -> tuple[dict, pd.DataFrame]:
    heldout = summary["heldout"] or {}
    metrics = {"step": summary["step"], "tokens": summary["tokens"], "anneal_start": summary["anneal_start"],
               "anneal_reason": summary["anneal_reason"], "skipped_steps": summary["skips_total"],
               "n_params": summary["n_params"], **{k: v for k, v in heldout.items() if "." in k}}
    return metrics, read_curve(Path(summary["out_dir"]))
