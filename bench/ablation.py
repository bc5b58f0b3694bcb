"""The recipe ablation: each option of the training recipe against the AdamW recipe it replaced,
on the default run (same data, tokens and seed), as DVC experiments; then their table.

    python bench/ablation.py queue        # one `dvc exp run --queue -n <name> -S ...` per row
    dvc queue start -j 1                  # one at a time: wall time and tok/s stay comparable
    python bench/ablation.py table        # the markdown table of docs/recipe.md, from the exp refs

Each row sets every key it differs in from the AdamW recipe explicitly, so the rows mean the same
whatever the shipped default is. The table reads each experiment's committed reports
(data/08_reporting) from its git ref, so it needs no workspace checkout.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys

FILES = {"pretrain": "conf/base/parameters_pretrain_stable.yml", "anneal": "conf/base/parameters_anneal.yml"}
MODEL = "++pretrain.model.overrides"  # Hydra's ++ adds the key or sets it
QK = f"{MODEL}.qk_norm"
# The rows up to r-recipe-60pct ran in fp32: lehr's CPU default before bf16 autocast.
FP32 = "pretrain.precision=fp32"
ADAMW = ["pretrain.optimizer=adamw", "pretrain.lr=0.003", f"{QK}=false", FP32]
MUON = ["pretrain.optimizer=muon", "pretrain.muon_lr=0.02", "pretrain.lr=0.003", f"{QK}=false", FP32]
TUNED = ["pretrain.optimizer=muon", "pretrain.muon_lr=0.01", "pretrain.lr=0.006", f"{QK}=false", FP32]
TUNED_QK = ["pretrain.optimizer=muon", "pretrain.muon_lr=0.01", "pretrain.lr=0.006", f"{QK}=true", FP32]
RECIPE = ["pretrain.optimizer=muon", "pretrain.muon_lr=0.02", "pretrain.lr=0.006", f"{QK}=true", FP32]
BF16 = [*RECIPE[:-1], "pretrain.precision=bf16"]
# A 280-step decay from step 490 instead of 140 from 630: the same 770 steps.
LONG_DECAY = ["pretrain.auto_anneal.max_fraction=0.7", "anneal.decay_steps=280"]
# name -> (what it changes, its settings), in the order they were tried: each of r-plus-* was
# tried on the best combination at the time (muon_lr 0.01).
ROWS = {
    "r-baseline": ("AdamW, lr 0.003 (the recipe before)", ADAMW),
    "r-muon": ("+ Muon on the hidden matrices, muon_lr 0.02", MUON),
    "r-muon-tuned": ("+ muon_lr 0.01, AdamW lr 0.006", TUNED),
    "r-muon-tuned-qk": ("+ QK-norm", TUNED_QK),
    "r-qk-muon02": ("+ muon_lr 0.02 again", RECIPE),
    "r-plus-zloss": ("QK-norm, muon_lr 0.01, + z-loss 1e-4", [*TUNED_QK, "pretrain.z_loss=0.0001"]),
    "r-plus-spike": (
        "QK-norm, muon_lr 0.01, + spike skipping (4 sigma, 64 steps)",
        [*TUNED_QK, "pretrain.spike_sigma=4"],
    ),
    "r-plus-decay280": ("QK-norm, muon_lr 0.01, + a 280-step anneal from step 490", [*TUNED_QK, *LONG_DECAY]),
    # 60% of the budget: stable to 378 (90% of 420), a 84-step anneal, 462 steps in all.
    "r-recipe-60pct": (
        "r-qk-muon02 on 60% of the tokens (462 steps)",
        [*RECIPE, "pretrain.total_steps=420"],
    ),
    "r-bf16": ("r-qk-muon02 in bf16 autocast (AVX512-BF16), Newton-Schulz batched by shape", BF16),
    # The same 4,096 tokens a step, as 16 sequences of 256; micro-batches of the same 2,048 tokens.
    "r-ctx256": (
        "r-bf16 with a 256-token context",
        [*BF16, f"{MODEL}.seq_len=256", "pretrain.batch_size=16", "pretrain.micro_batch=8"],
    ),
    # ~2.5M parameters like cpu-demo's 2.56M: six blocks of width 160 instead of four of 192.
    "r-deep6": (
        "r-bf16, six blocks of width 160 (d_ff 432)",
        [*BF16, f"{MODEL}.n_layer=6", f"{MODEL}.d_model=160", f"{MODEL}.d_ff=432"],
    ),
    "r-lr012": ("r-bf16 with AdamW lr 0.012 (embeddings, head, gains)", [*BF16, "pretrain.lr=0.012"]),
}
REPORTS = "data/08_reporting"


def queue(names: list[str]) -> None:
    for name in names:
        # Each setting goes to the file of its top-level key (pretrain.* or anneal.*).
        sets = [arg for s in ROWS[name][1] for arg in ("-S", f"{FILES[s.lstrip('+').split('.')[0]]}:{s}")]
        subprocess.run(["dvc", "exp", "run", "--queue", "-n", name, *sets], check=True)


def _ref(name: str) -> str:
    refs = subprocess.run(
        ["git", "for-each-ref", "--sort=-committerdate", "--format=%(refname)", "refs/exps"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = [r for r in refs if r.rsplit("/", 1)[-1] == name]
    if not found:
        sys.exit(f"no experiment named {name!r}: run `python bench/ablation.py queue` and `dvc queue start`")
    return found[0]  # the newest of that name


def _show(ref: str, path: str) -> str:
    return subprocess.run(["git", "show", f"{ref}:{path}"], capture_output=True, text=True, check=True).stdout


def first_step_at(rows: list[dict], target: float) -> int | None:
    """The first eval step whose held-out bits per byte is at or below ``target``."""
    for row in rows:
        if row["kind"] == "eval" and row["heldout.bpb"] and float(row["heldout.bpb"]) <= target:
            return int(row["step"])
    return None


def table(names: list[str]) -> str:
    # The curves score 32 held-out windows per source at each eval; the target is the baseline's
    # final figure on that same measure (metrics.json's columns score 64 windows per source).
    target = json.loads(_show(_ref("r-baseline"), f"{REPORTS}/anneal_metrics.json"))["heldout"]["bpb"]
    lines = [
        "| run | change | pre_anneal | anneal | Wikipedia | State of the Union | "
        f"first eval step at {target:.3f} | stable + anneal wall | training tok/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in names:
        ref = _ref(name)
        stable = json.loads(_show(ref, f"{REPORTS}/stable_metrics.json"))
        anneal = json.loads(_show(ref, f"{REPORTS}/anneal_metrics.json"))
        scored = json.loads(_show(ref, f"{REPORTS}/metrics.json"))
        curve = [
            *csv.DictReader(io.StringIO(_show(ref, f"{REPORTS}/stable_curve.csv"))),
            *csv.DictReader(io.StringIO(_show(ref, f"{REPORTS}/anneal_curve.csv"))),
        ]
        reached = first_step_at(curve, target)
        wall = stable["wall_seconds"] + anneal["wall_seconds"]  # evals and checkpoints included
        pre, end = scored["pre_anneal"], scored["anneal"]
        lines.append(
            f"| {name} | {ROWS[name][0]} | {pre['heldout']['bpb']:.3f} | **{end['heldout']['bpb']:.3f}** | "
            f"{end['wikipedia']['bpb']:.3f} | {end['sotu']['bpb']:.3f} | "
            f"{reached if reached is not None else '-'} | {wall / 60:.1f} min | {stable['tok_per_s']:,} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["queue", "table"])
    parser.add_argument("names", nargs="*", default=list(ROWS), help="rows (default: all)")
    args = parser.parse_args()
    if args.action == "queue":
        queue(args.names)
    else:
        print(table(args.names))


if __name__ == "__main__":
    main()
