"""What the training stages report beside their models: their metrics (DVC metrics, MLflow) and
curves (DVC plots) from the engine's run summary and ``metrics.jsonl``. The figures drawn from
them are ``lehr.reports.plots``: a stage that trains never imports matplotlib."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lehr.engine.run.metrics import CLOCK_KEYS


def stage_metrics(summary: dict, **own) -> dict:
    """A training stage's metrics: the figures only that stage has (``own``), then those of every
    run, then the last held-out eval per source. No clock reading: DVC versions these, and the
    same configuration, data and code must give the same file (``stage_timing`` has the clock)."""
    heldout = summary["heldout"] or {}
    return {
        **own,
        "step": summary["step"],
        "tokens": summary["tokens"],
        "skipped_steps": summary["skips_total"],
        "skipped_spikes": summary["spikes_total"],
        "tiers": summary["tiers"],
        **{source: m for source, m in heldout.items() if isinstance(m, dict)},
    }


def stage_timing(summary: dict) -> dict:
    """What the clock said of a training stage's whole run (every attempt of a resumed one): for
    data/08_reporting/timing/, which neither git nor DVC versions, and MLflow."""
    return {
        "step": summary["step"],
        "wall_seconds": summary["wall_seconds"],
        "tok_per_s": summary["tok_per_s"],
        "share": summary.get("share", {}),  # host, cores, GPUs: the share of the machine it ran on
    }


def read_curve(run_dir: Path) -> pd.DataFrame:
    """The run's metrics.jsonl as a table (DVC plots and the evaluate stage read it)."""
    frame = pd.read_json(run_dir / "metrics.jsonl", lines=True)
    # A run folder from before the clock moved to timing.jsonl still has it inline: never versioned.
    return frame.drop(columns=[c for c in ("sample", *CLOCK_KEYS) if c in frame.columns])
