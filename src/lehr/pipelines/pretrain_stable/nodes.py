"""pretrain_stable: warmup + stable LR until the anneal start, then hand on ``pre_anneal`` and
the branch points kept on the way."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lehr.params.stages import PretrainParams
from lehr.reports.stage_reports import read_curve, stage_metrics, stage_timing
from lehr.training.job import run_engine, stable_job


def train_stable(
    shards: dict, runs_root: Path, tasks: dict[str, Path], params: PretrainParams
) -> tuple[Path, dict[str, Path], dict]:
    """``runs_root`` is the catalog's ``stable_run``: the folder that holds each stable run's own."""
    summary = run_engine(stable_job(params, shards, runs_root, tasks), params)
    points = {name: Path(path) for name, path in summary["branch_points"].items()}
    return Path(summary["pre_anneal"]), points, summary


def summarize_stable(summary: dict) -> tuple[dict, pd.DataFrame, dict]:
    metrics = stage_metrics(
        summary,
        anneal_start=summary["anneal_start"],
        anneal_reason=summary["anneal_reason"],
        n_params=summary["n_params"],
    )
    return metrics, read_curve(Path(summary["out_dir"])), stage_timing(summary)
