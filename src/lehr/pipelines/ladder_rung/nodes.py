"""ladder_rung: one size of the ladder (``ladder.rung``): its stable run with a branch point at
every budget and a cooldown from each (``lehr.training.ladder_rungs``)."""

from __future__ import annotations

from pathlib import Path

from lehr.params.ladder import LadderParams
from lehr.params.stages import AnnealParams, PretrainParams
from lehr.training.ladder_rungs import train_rung


def train_ladder_rung(
    shards: dict,
    ladder_runs: Path,
    tasks: dict[str, Path],
    pretrain: PretrainParams,
    anneal: AnnealParams,
    ladder: LadderParams,
) -> dict:
    if ladder.rung not in ladder.sizes:
        raise ValueError(
            f"ladder.rung = {ladder.rung} is not one of ladder.sizes {ladder.sizes}: name the size to "
            "train (`kedro run --pipelines ladder_rung --params ladder.rung=3`), or run every size with "
            "`make ladder`"
        )
    runs = ladder_runs / f"rung-{ladder.rung}"
    return {ladder.rung: train_rung(pretrain, anneal, ladder, ladder.rung, shards, runs, tasks)}
