"""Benchmark: does one learning rate suit every size of the ladder? For the smallest and largest
rung shapes (``ladder.shape`` at ``--depths``), Muon's ``muon_lr`` and AdamW's ``lr`` are each
swept over ``--multipliers`` of the recipe's value; every run is a rung exactly as ``make ladder``
trains it (``lehr.training.ladder_rungs.train_rung``: a stable run to the budget and a cooldown of
``ladder.decay_ratio`` of it), and its held-out bits per byte are printed, with each size's best
multiplier. With Muon the AdamW groups (embeddings, gains) keep the recipe's ``lr``: the sweep
moves the rate whose transfer across widths is in question, Muon's on the hidden matrices.

Reads the project's shards (``make run`` builds them) and conf/base's recipe; writes its runs
under a temporary folder.

    python bench/lr_transfer.py [--depths 2,5] [--multipliers 0.5,1,2] [--tokens 262144]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from lehr.catalog.shards_dataset import ShardsDataset
from lehr.config_parts import from_mapping
from lehr.params.ladder import LadderParams
from lehr.params.stages import AnnealParams, PretrainParams
from lehr.training.ladder_rungs import train_rung

ROOT = Path(__file__).resolve().parent.parent


def section(name: str, file: str):
    return yaml.safe_load((ROOT / "conf" / "base" / file).read_text())[name]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", default=str(ROOT / "data" / "04_feature" / "shards"))
    p.add_argument("--depths", default="2,5")
    p.add_argument("--multipliers", default="0.5,1,2")
    p.add_argument("--tokens", type=int, default=262144, help="each run's budget (whole steps)")
    p.add_argument("--optimizers", default="muon,adamw")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not (Path(args.shards) / "manifest.json").is_file():
        raise SystemExit(f"no shards at {args.shards}: run `make run` first (or pass --shards)")
    shards = ShardsDataset(args.shards).load()
    recipe = from_mapping(PretrainParams, section("pretrain", "parameters_pretrain_stable.yml"), "pretrain")
    anneal = from_mapping(AnnealParams, section("anneal", "parameters_anneal.yml"), "anneal")
    ladder = from_mapping(LadderParams, section("ladder", "parameters_ladder.yml"), "ladder")
    ladder = dataclasses.replace(ladder, budgets=[args.tokens])
    depths = [int(x) for x in args.depths.split(",")]
    multipliers = [float(x) for x in args.multipliers.split(",")]
    results: dict[tuple[str, int], dict[float, float]] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for optimizer in args.optimizers.split(","):
            key = "muon_lr" if optimizer == "muon" else "lr"
            for depth in depths:
                for m in multipliers:
                    rate = getattr(recipe, key) * m
                    p_run = dataclasses.replace(recipe, optimizer=optimizer, **{key: rate})
                    runs = Path(tmp) / f"{optimizer}-{depth}-{m}"
                    rung = train_rung(p_run, anneal, ladder, depth, shards, runs, {})
                    results.setdefault((optimizer, depth), {})[m] = rung["endpoints"][-1]["bpb"]
                    width = ladder.shape.of(depth)["d_model"]
                    print(
                        f"{optimizer:5s} depth {depth} (width {width:4d}, {rung['n_params'] / 1e6:.2f}M) "
                        f"{key} {rate:.2e} ({m:g}x): held-out {results[(optimizer, depth)][m]:.4f} bpb",
                        flush=True,
                    )
    print(
        f"\n{args.tokens:,} tokens per run, cooldown {ladder.decay_ratio:g}; held-out bits per byte "
        f"({time.perf_counter() - t0:.0f} s in all)"
    )
    print("optimizer  depth  width  " + "  ".join(f"{m:>7g}x" for m in multipliers) + "   best")
    for (optimizer, depth), row in results.items():
        best = min(row, key=row.get)
        cells = "  ".join(f"{row[m]:8.4f}" for m in multipliers)
        print(f"{optimizer:9s}  {depth:5d}  {ladder.shape.of(depth)['d_model']:5d}  {cells}   {best:g}x")
    for optimizer in args.optimizers.split(","):
        bests = [min(results[(optimizer, d)], key=results[(optimizer, d)].get) for d in depths]
        # How much the smallest size's best rate costs the largest: the price of one rate for all.
        big = results[(optimizer, depths[-1])]
        price = big[bests[0]] - big[bests[-1]]
        print(
            f"{optimizer}: best multiplier per depth {dict(zip(depths, bests, strict=True))}; "
            f"the smallest's best at depth {depths[-1]} costs {price:+.4f} bpb (median spread over the sweep "
            f"{statistics.median(big.values()) - min(big.values()):.4f})"
        )


if __name__ == "__main__":
    main()
