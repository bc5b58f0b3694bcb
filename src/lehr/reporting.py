"""What the training stages report: their metrics (DVC metrics, MLflow) and curves (DVC plots),
built from the engine's run summary and the run's ``metrics.jsonl``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def stage_metrics(summary: dict, **own) -> dict:
    """A training stage's metrics: the figures only that stage has (``own``), then those of every
    run, then the last held-out eval per source."""
    heldout = summary["heldout"] or {}
    return {
        **own,
        "step": summary["step"],
        "tokens": summary["tokens"],
        "skipped_steps": summary["skips_total"],
        "skipped_spikes": summary["spikes_total"],
        "wall_seconds": summary["wall_seconds"],
        "tok_per_s": summary["tok_per_s"],
        "tiers": summary["tiers"],
        **{source: m for source, m in heldout.items() if isinstance(m, dict)},
    }


def read_curve(run_dir: Path) -> pd.DataFrame:
    """The run's metrics.jsonl as a table (DVC plots and the evaluate stage read it)."""
    frame = pd.read_json(run_dir / "metrics.jsonl", lines=True)
    return frame.drop(columns=[c for c in ("sample", "mem") if c in frame.columns])
