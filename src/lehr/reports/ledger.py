"""The recipe's ledger: is an ingredient a finding, or the noise of one seed against another?

The default run is trained at a few seeds (each seed draws another model init, stable-phase data
order and anneal data order); that spread is the noise floor. Each ingredient is trained at the
same seeds, so that each of its runs pairs with the default of its seed: the same init (an
ingredient's own parameters are drawn after the plain model's), the same windows, the same
held-out items. Its effect is the mean over the seeds of the paired held-out difference, with a
bootstrap interval that resamples the held-out windows (each drawn window counts in every seed).
An effect is a finding when its interval leaves out zero and it is larger than the floor: the
largest difference two seeds of the default alone make.

Kedro-free: ``bench/ablation.py`` queues the runs as DVC experiments and prints this table from
their committed reports.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from lehr.reports.comparison import Scored, heldout_bits, paired


def seed_settings(seed: int) -> dict[str, int]:
    """The settings of seed ``seed``: seed 0 is the shipped default (seed 0, data seeds 1 and 2),
    and every seed's stable and anneal data seeds are their own."""
    return {"pretrain.seed": seed, "pretrain.data_seed": 2 * seed + 1, "anneal.data_seed": 2 * seed + 2}


def check_seeds(seeds: list[int], what: str = "--seeds") -> list[int]:
    """The seeds, each once and none negative; a repeat would count one run as two."""
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(
            f"{what} {' '.join(map(str, seeds))} repeats seed {', '.join(map(str, repeated))}: each seed is "
            f"one run, and a repeat would count it twice; give distinct seeds, e.g. {what} 0 1 2"
        )
    if any(s < 0 for s in seeds) or not seeds:
        raise ValueError(f"{what} {' '.join(map(str, seeds))}: give one or more seeds >= 0, e.g. {what} 0 1")
    return seeds


@dataclass(frozen=True)
class NoiseFloor:
    bpb: dict[int, float]  # each seed's held-out bits per byte (the anneal's end)
    pairs: dict[tuple[int, int], dict]  # (i, j): seed j - seed i on the same windows, paired
    floor: float  # the largest |difference| of two seeds: smaller effects are not findings

    @property
    def spread(self) -> float:
        """The seeds' standard deviation (n - 1)."""
        return float(np.std(list(self.bpb.values()), ddof=1)) if len(self.bpb) > 1 else float("nan")


def noise_floor(defaults: dict[int, Scored], bpb: dict[int, float]) -> NoiseFloor:
    if len(defaults) < 2:
        raise ValueError(
            f"the noise floor needs the default at two seeds or more; there is {len(defaults)} "
            "(`python bench/ablation.py noise --seeds 0 1 2`, then `dvc queue start -j 1`)"
        )
    names = _names(list(defaults.values()))
    pairs = {
        (i, j): paired(heldout_bits(defaults[i], names)[0], *heldout_bits(defaults[j], names))
        for i, j in itertools.combinations(sorted(defaults), 2)
    }
    return NoiseFloor(dict(sorted(bpb.items())), pairs, max(abs(p["diff"]) for p in pairs.values()))


def effect(defaults: dict[int, Scored], treated: dict[int, Scored]) -> dict:
    """The treated runs against the defaults of their seeds: the mean paired held-out bits-per-byte
    difference over the seeds both have, with its interval and those seeds."""
    seeds = sorted(set(defaults) & set(treated))
    if not seeds:
        raise ValueError("no seed has both the default and this ingredient: queue them at the same --seeds")
    names = _names([defaults[s] for s in seeds] + [treated[s] for s in seeds])
    base = [heldout_bits(defaults[s], names) for s in seeds]
    other = [heldout_bits(treated[s], names)[0] for s in seeds]
    return {**paired(np.stack([b for b, _ in base]), np.stack(other), base[0][1]), "seeds": seeds}


def verdict(e: dict, floor: float) -> str:
    if not e["significant"]:
        return "no significant difference"
    if abs(e["diff"]) <= floor:
        return "below the noise floor"
    return "better" if e["diff"] < 0 else "worse"


def _names(scored: list[Scored]) -> list[str]:
    """The held-out sources, refused unless every run was scored on the same items."""
    first = scored[0]
    if any(s.items != first.items for s in scored):
        raise ValueError(
            "these runs were scored on different held-out windows or task examples (other shards, context "
            "or eval_windows): their paired differences mean nothing. Compare runs of one shard stage."
        )
    return list(first.nats)
