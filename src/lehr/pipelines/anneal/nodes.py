"""anneal: branch from ``pre_anneal`` (or a branch point) and decay the LR on the anneal mix,
into a branch folder."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from lehr.catalog.branches_dataset import check_free
from lehr.engine.run.metrics import METRICS
from lehr.params.stages import AnnealParams, PretrainParams
from lehr.paths import run_by_dvc
from lehr.project.experiment_refs import refuse_experiment_branch
from lehr.reports.stage_reports import read_curve, stage_metrics, stage_timing
from lehr.training.job import anneal_job, origin_of, run_engine


def train_anneal(
    shards: dict,
    pre_anneal: Path,
    branch_points: dict[str, Path],
    anneal_runs: Path,
    tasks: dict[str, Path],
    branches: dict[str, Path],
    pretrain: PretrainParams,
    anneal: AnnealParams,
) -> tuple[dict, dict]:
    origin = origin_of(anneal, pre_anneal, branch_points)
    cfg, branch = anneal_job(pretrain, anneal, shards, origin, anneal_runs, tasks)
    # Before any work: a name DVC's branch, or an experiment's, holds is not one to train into by hand.
    check_free(branch, branches)
    if not run_by_dvc("anneal"):
        refuse_experiment_branch(branch, Path.cwd())
    summary = run_engine(cfg, pretrain)
    run_dir = Path(cfg.out_dir)
    # The branch's curve, as DVC versions it: what the run computed, never what the clock said.
    curve = (run_dir / METRICS).read_text()
    params = {"pretrain": dataclasses.asdict(pretrain), "anneal": dataclasses.asdict(anneal)}
    saved = {"branch": branch, "run_dir": str(run_dir), "curve": curve, "params": params}
    return saved, {**summary, "branch": branch}


def summarize_anneal(summary: dict) -> tuple[dict, pd.DataFrame, dict]:
    metrics = stage_metrics(
        summary,
        branch=summary["branch"],
        stopped=summary["stopped"] or "end",
        best_heldout_loss=summary["best_loss"],
    )
    return metrics, read_curve(Path(summary["out_dir"])), stage_timing(summary)
