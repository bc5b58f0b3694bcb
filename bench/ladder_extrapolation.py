"""Benchmark: does the ladder's law hold past its rungs? One rung beyond the fit, near twice the
largest rung's parameters (the depth of the ladder's shape rule nearest 2x, in log) at twice its
largest budget, trained exactly as ``make ladder`` trains a rung (``lehr.training.ladder_rungs.
train_rung``: the recipe at that shape, a stable phase to the budget and a cooldown of
``ladder.decay_ratio`` of it), then its held-out bits per byte against what the committed fit
predicts at its parameters and tokens, with the fit's 95% interval.

The held-out-rung check in ``ladder.json`` asks whether the law interpolates within its family;
this asks the question a user brings to a bigger run. It takes about an hour on 2 CPU cores, so it
is a benchmark, not a test; docs/ladder.md keeps its latest figures.

Reads the project's shards (``make run`` builds them) and the parameters of the profile in force,
as the ladder's stages do; trains under ``--runs`` (resumed when killed and rerun) and writes
nothing the ladder's stages own.

    python bench/ladder_extrapolation.py [--depth 5] [--budget 4014080] [--runs build/bench/extrapolation]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import time
from pathlib import Path

import torch

from lehr.catalog.shards_dataset import ShardsDataset
from lehr.config_parts import from_mapping
from lehr.engine.model import Transformer, preset
from lehr.files.atomic import write_text_atomic
from lehr.params.check import load_parameters
from lehr.params.ladder import LadderParams
from lehr.params.stages import AnnealParams, PretrainParams
from lehr.paths import profile_in_force
from lehr.reports.scaling_fit import predict
from lehr.training.ladder_rungs import recipe_overrides, train_rung

ROOT = Path(__file__).resolve().parent.parent


def n_params(ladder: LadderParams, overrides: dict, depth: int, vocab: int) -> int:
    cfg = preset(ladder.shape.preset, vocab, **{**overrides, **ladder.shape.of(depth)})
    with torch.device("meta"):  # counted, not allocated
        return Transformer(cfg).num_parameters()


def nearest_double(ladder: LadderParams, overrides: dict, after: int, largest: int, vocab: int) -> int:
    """The depth past ``after`` (the fit's deepest rung) whose parameter count is nearest 2x
    ``largest``, in log."""
    depth, best = after + 1, None
    while True:
        gap = abs(math.log(n_params(ladder, overrides, depth, vocab) / (2 * largest)))
        if best is not None and gap >= best[1]:
            return best[0]
        best, depth = (depth, gap), depth + 1


def read_fit(path: Path, ladder: LadderParams, overrides: dict) -> dict:
    """The committed fit, refused before an hour of training if it cannot judge this rung: no law,
    too few bootstrap refits for an interval, or another family than conf's ladder (then the
    rung's error would measure a change of recipe, not the law's reach)."""
    if not path.is_file():
        raise SystemExit(f"no ladder fit at {path}: run `make ladder` first (or pass --fit)")
    fitted = json.loads(path.read_text())
    if fitted.get("status") != "fitted" or len(fitted.get("bootstrap_laws", [])) < 10:
        raise SystemExit(
            f"{path} has no law with an interval to check (status {fitted.get('status')!r}, "
            f"{len(fitted.get('bootstrap_laws', []))} bootstrap refits): run `make ladder` with "
            "ladder.bootstrap of 10 or more"
        )
    family, conf = fitted.get("family"), ladder.family(overrides)
    drift = {
        k: (family.get(k), conf[k])
        for k in ("shape", "overrides", "decay_ratio")
        if family is None or family.get(k) != conf[k]
    }
    if drift:
        raise SystemExit(
            f"{path} was fitted to another family than conf's ladder (fit, conf): {drift}; run `make ladder`"
        )
    return fitted


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fit", default=str(ROOT / "data" / "08_reporting" / "ladder.json"))
    p.add_argument("--shards", default=str(ROOT / "data" / "04_feature" / "shards"))
    p.add_argument("--depth", type=int, help="the rung's depth (default: the one nearest 2x the parameters)")
    p.add_argument("--budget", type=int, help="stable tokens before its cooldown (default: 2x the largest)")
    p.add_argument("--runs", default=str(ROOT / "build" / "bench" / "extrapolation"))
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    shards_path = Path(args.shards)
    if not (shards_path / "manifest.json").is_file():
        raise SystemExit(f"no shards at {shards_path}: run `make run` first (or pass --shards)")
    params = load_parameters(ROOT / "conf", profile_in_force(ROOT))
    recipe = from_mapping(PretrainParams, params["pretrain"], "pretrain")
    anneal = from_mapping(AnnealParams, params["anneal"], "anneal")
    ladder = from_mapping(LadderParams, params["ladder"], "ladder")
    overrides = recipe_overrides(recipe, ladder)
    fitted = read_fit(Path(args.fit), ladder, overrides)
    shards = ShardsDataset(str(shards_path)).load()
    vocab = shards["tokenizer"]["vocab_size"]  # the model the rung trains has the shards' vocabulary
    deepest = max(fitted["family"]["depths"])
    largest = max(pt["n_params"] for pt in fitted["points"])
    depth = nearest_double(ladder, overrides, deepest, largest, vocab) if args.depth is None else args.depth
    if depth <= deepest:
        raise SystemExit(f"--depth {depth} is within the fit's rungs (to {deepest}): choose a deeper one")
    budget = args.budget or 2 * max(ladder.budgets)
    rung_ladder = dataclasses.replace(ladder, sizes=[depth], budgets=[budget])
    t0 = time.perf_counter()
    rung = train_rung(recipe, anneal, rung_ladder, depth, shards, Path(args.runs) / f"rung-{depth}", {})
    seconds = time.perf_counter() - t0
    end = rung["endpoints"][-1]
    r = predict(fitted, rung["n_params"], end["tokens"])
    lo, hi = r["bpb_interval"]
    largest_tokens = max(pt["tokens"] for pt in fitted["points"])
    result = {
        "depth": depth,
        "shape": rung["shape"],
        "n_params": rung["n_params"],
        "tokens": end["tokens"],
        "params_ratio": rung["n_params"] / largest,
        "tokens_ratio": end["tokens"] / largest_tokens,
        "bpb": end["bpb"],
        "predicted_bpb": r["bpb"],
        "interval": [lo, hi],
        "error": r["bpb"] / end["bpb"] - 1,
        "inside": lo <= end["bpb"] <= hi,
        "seconds": round(seconds),
    }
    record = json.dumps({**result, "rung": rung}, indent=1) + "\n"
    write_text_atomic(Path(args.runs) / f"rung-{depth}.json", record)  # a kill leaves the last whole one
    print(
        f"\nextrapolation rung: depth {depth} ({rung['n_params']:,} parameters, "
        f"{result['params_ratio']:.2f}x the largest rung's), {end['tokens']:,} tokens "
        f"({result['tokens_ratio']:.2f}x the largest endpoint's), trained in {seconds:.0f} s"
    )
    print(
        f"held-out {end['bpb']:.4f} bits/byte; the fit predicts {r['bpb']:.4f} [{lo:.4f}, {hi:.4f}]: "
        f"{result['error']:+.2%}, {'inside' if result['inside'] else 'outside'} its interval"
    )


if __name__ == "__main__":
    main()
