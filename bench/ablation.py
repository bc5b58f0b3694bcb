"""The recipe's evidence, as DVC experiments on the default run, and its tables.

The ledger (lehr.reports.ledger): the default at a few seeds gives the noise floor, and
each ingredient alone at the same seeds is compared with the default of its seed (paired 95%
interval over the same held-out windows, tok/s against the default's):

    python bench/ablation.py noise --seeds 0 1 2     # the default at each seed
    python bench/ablation.py ledger --seeds 0 1      # each ingredient (or those named) at each seed
    dvc queue start -j 1                             # one at a time: wall time and tok/s stay comparable
    python bench/ablation.py ledger-table            # the noise floor and a row per ingredient
    python bench/ablation.py combine relu2 normuon --seeds 0 1   # the winners together, then the table again

The history (docs/recipe.md's first table): each option of the recipe against the AdamW recipe it
replaced, on the default run of its day (same data, tokens and seed):

    python bench/ablation.py queue        # one `dvc exp run --queue -n <name> -S ...` per row
    python bench/ablation.py table        # the markdown table of docs/recipe.md, from the exp refs

Each history row sets every key that any row changes explicitly (BASE below), so the rows mean the
same whatever the shipped default is; a ledger run changes only its ingredient and its seed, so it
is relative to the commit it is queued on. The tables read each experiment's committed reports
(data/08_reporting) from its git ref, so they need no workspace checkout, and wall time and tok/s
from the project's MLflow store (no versioned file holds a clock reading).
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import json
import subprocess
import sys
from pathlib import Path

import yaml

from lehr.project.experiment_refs import experiments_of, git
from lehr.project.experiments import figures
from lehr.reports.comparison import Scored
from lehr.reports.ledger import check_seeds, effect, noise_floor, seed_settings, verdict

FILES = {"pretrain": "conf/base/parameters_pretrain_stable.yml", "anneal": "conf/base/parameters_anneal.yml"}
MODEL = "++pretrain.model.overrides"  # Hydra's ++ adds the key or sets it
# The AdamW recipe the ablation starts from, every key that any row changes pinned, so that each
# row means the same whatever the shipped default is: cpu-demo as it was (four blocks of 192,
# 128-token context, no QK-norm), 32 x 128 tokens a step, fp32 (lehr's CPU default then), and the
# anneal moving to Wikipedia (gold) alone in its second half.
BASE = {
    "pretrain.optimizer": "adamw",
    "pretrain.lr": 0.003,
    "pretrain.muon_lr": 0.02,
    "pretrain.precision": "fp32",
    f"{MODEL}.qk_norm": "false",
    f"{MODEL}.layer_scalars": "false",  # in the default now
    f"{MODEL}.n_layer": 4,
    f"{MODEL}.d_model": 192,
    f"{MODEL}.d_ff": 512,
    f"{MODEL}.seq_len": 128,
    "pretrain.batch_size": 32,
    "pretrain.micro_batch": 16,
    "anneal.mix": "[[0.5,{gold:1.0,silver:0.25}],[1.0,{gold:1.0}]]",
}
MUON = {**BASE, "pretrain.optimizer": "muon"}
TUNED = {**MUON, "pretrain.muon_lr": 0.01, "pretrain.lr": 0.006}
TUNED_QK = {**TUNED, f"{MODEL}.qk_norm": "true"}
RECIPE = {**TUNED_QK, "pretrain.muon_lr": 0.02}
BF16 = {**RECIPE, "pretrain.precision": "bf16"}
# The same 4,096 tokens a step, as 16 sequences of 256 (micro-batches of the same 2,048 tokens).
CTX256 = {f"{MODEL}.seq_len": 256, "pretrain.batch_size": 16, "pretrain.micro_batch": 8}
# ~2.57M parameters like the 2.56M of four blocks of 192: three of width 216 (4 heads of 54).
WIDE3 = {f"{MODEL}.n_layer": 3, f"{MODEL}.d_model": 216, f"{MODEL}.d_ff": 576}
# The anneal keeps the stable phase's even mix instead of moving to Wikipedia alone.
EVEN = {"anneal.mix": "[[1.0,{gold:1.0,silver:1.0}]]"}
# A 280-step decay from step 490 instead of 140 from 630: the same 770 steps.
LONG_DECAY = {"pretrain.auto_anneal.max_fraction": 0.7, "anneal.decay_steps": 280}
NEXT = {**BF16, **WIDE3, **CTX256, **EVEN, **LONG_DECAY}
# Width 256: 4 heads of 64.
W256 = {f"{MODEL}.d_model": 256, f"{MODEL}.d_ff": 688}
# name -> (what it changes, its settings), in the order they were tried; each r-plus-* on the best
# combination at the time (muon_lr 0.01).
ROWS = {
    "r-baseline": ("AdamW, lr 0.003 (the recipe before)", BASE),
    "r-muon": ("+ Muon on the hidden matrices, muon_lr 0.02", MUON),
    "r-muon-tuned": ("+ muon_lr 0.01, AdamW lr 0.006", TUNED),
    "r-muon-tuned-qk": ("+ QK-norm", TUNED_QK),
    "r-qk-muon02": ("+ muon_lr 0.02 again", RECIPE),
    "r-plus-zloss": ("QK-norm, muon_lr 0.01, + z-loss 1e-4", {**TUNED_QK, "pretrain.z_loss": 0.0001}),
    "r-plus-spike": (
        "QK-norm, muon_lr 0.01, + spike skipping (4 sigma, 64 steps)",
        {**TUNED_QK, "pretrain.spike_sigma": 4},
    ),
    "r-plus-decay280": (
        "QK-norm, muon_lr 0.01, + a 280-step anneal from step 490",
        {**TUNED_QK, **LONG_DECAY},
    ),
    # 60% of the budget: stable to 378 (90% of 420), a 84-step anneal, 462 steps in all.
    "r-recipe-60pct": (
        "r-qk-muon02 on 60% of the tokens (462 steps)",
        {**RECIPE, "pretrain.planned_steps": 420},
    ),
    "r-bf16": ("r-qk-muon02 in bf16 autocast (AVX512-BF16), Newton-Schulz batched by shape", BF16),
    "r-lr012": ("r-bf16 with AdamW lr 0.012 (embeddings, head, gains)", {**BF16, "pretrain.lr": 0.012}),
    "r-ctx256": ("r-bf16 with a 256-token context (16 x 256 tokens a step)", {**BF16, **CTX256}),
    "r-ctx512": (
        "r-bf16 with a 512-token context (8 x 512 tokens a step)",
        {**BF16, f"{MODEL}.seq_len": 512, "pretrain.batch_size": 8, "pretrain.micro_batch": 4},
    ),
    "r-deep6": (
        "r-bf16, six blocks of width 160 (d_ff 432)",
        {**BF16, f"{MODEL}.n_layer": 6, f"{MODEL}.d_model": 160, f"{MODEL}.d_ff": 432},
    ),
    "r-wide3": ("r-bf16, three blocks of width 216 (d_ff 576)", {**BF16, **WIDE3}),
    "r-anneal-even": ("r-bf16, the anneal on the stable mix (gold 1, silver 1)", {**BF16, **EVEN}),
    "r-wide3-ctx256": ("r-wide3 with a 256-token context", {**BF16, **WIDE3, **CTX256}),
    "r-wide3-ctx256-even": (
        "r-wide3-ctx256, the anneal on the stable mix",
        {**BF16, **WIDE3, **CTX256, **EVEN},
    ),
    "r-wide3-ctx256-even280": (
        "r-wide3-ctx256-even, a 280-step anneal from step 490",
        NEXT,
    ),
    "r-next-w256": (
        "r-wide3-ctx256-even280, three blocks of width 256 (d_ff 688, 3.42M params)",
        {**NEXT, **W256},
    ),
    "r-next-muon03": ("r-wide3-ctx256-even280 with muon_lr 0.03", {**NEXT, "pretrain.muon_lr": 0.03}),
    "r-next-w256-l4": (
        "r-next-w256 with four blocks (4.21M params)",
        {**NEXT, **W256, f"{MODEL}.n_layer": 4},
    ),
    "r-next-w256-l5": (
        "r-next-w256 with five blocks (5.00M params)",
        {**NEXT, **W256, f"{MODEL}.n_layer": 5},
    ),
    # 60% of the budget on the new default: stable to 294 (0.7 of 420), a 168-step anneal, 462 steps.
    "r-default-60pct": (
        "r-next-w256 on 60% of the tokens (462 steps)",
        {
            **NEXT,
            **W256,
            "pretrain.planned_steps": 420,
            "anneal.decay_steps": 0,
            "anneal.decay_fraction": 0.4,
        },
    ),
    "r-next-w320": (
        "r-wide3-ctx256-even280, three blocks of width 320 (5 heads of 64, d_ff 864, 5.03M params)",
        {**NEXT, f"{MODEL}.d_model": 320, f"{MODEL}.n_head": 5, f"{MODEL}.d_ff": 864},
    ),
}
# -- the ledger -------------------------------------------------------------------------------------
# The same tokens in half the steps: twice the sequences, the plan and warmup halved (the levers below).
BATCH32 = {"pretrain.batch_size": 32, "pretrain.planned_steps": 350, "pretrain.warmup_steps": 20}
# name -> (what it is, its source, its settings on the default run); docs/recipe.md says each.
INGREDIENTS = {
    "value-embeds": (
        "value embeddings on alternate blocks",
        "modded-nanogpt #14; nanochat",
        {f"{MODEL}.value_embeds": "true"},
    ),
    "layer-scalars": ("learned residual and x0 scalars", "nanochat", {f"{MODEL}.layer_scalars": "true"}),
    # Two matrices where SwiGLU has three: d_ff 688 x 1.5 keeps the parameter count.
    "relu2": (
        "ReLU² MLP at SwiGLU's size (d_ff 1032)",
        "modded-nanogpt #5; nanochat",
        {f"{MODEL}.mlp": "relu2", f"{MODEL}.d_ff": 1032},
    ),
    "softcap": ("logits soft-capped at 15", "Gemma 2; modded-nanogpt #18", {f"{MODEL}.logit_softcap": 15}),
    "muon-decay": ("Muon weight decay 0.1", "nanochat", {"pretrain.muon_weight_decay": 0.1}),
    "cautious-decay": (
        "Muon weight decay 0.1, cautious",
        "arXiv 2510.12402; nanochat",
        {"pretrain.muon_weight_decay": 0.1, "pretrain.muon_cautious_decay": "true"},
    ),
    "polar-express": (
        "Polar Express orthogonalisation",
        "arXiv 2505.16932; nanochat",
        {"pretrain.muon_orthogonaliser": "polar_express"},
    ),
    "normuon": ("NorMuon, beta2 0.95", "arXiv 2510.05491; nanochat", {"pretrain.muon_normuon_beta2": 0.95}),
    "packing": (
        "whole documents packed from each row's start, best fit",
        "nanochat (BOS-aligned best fit)",
        {"pretrain.packing": "bos_best_fit"},
    ),
    # The same steps would train 6.8% fewer tokens (840 sequences fewer over the ramp's 105 steps),
    # so the plan grows to 747 steps: 523 stable and 299 annealed, 12,312 sequences against the
    # default's 12,320 (0.06% fewer tokens). More, smaller steps at the same tokens is the ingredient.
    "batch-warmup": (
        "batch-size warmup: 4, 8, 12 sequences for 35 steps each, then 16",
        "modded-nanogpt #46",
        {"pretrain.batch_warmup_steps": 105, "pretrain.batch_warmup_start": 4, "pretrain.planned_steps": 747},
    ),
    # The anneal's alone: at the baseline's own seeds its queued experiment finds pretrain_stable up
    # to date and anneals the baseline's pre_anneal from DVC's cache (no stable phase of its own to
    # time); at another seed it trains that seed's stable phase, as the default at that seed does.
    "tail-average": (
        "the decay's last 20% of steps averaged",
        "Tail-EMA; Polyak",
        {"anneal.tail_fraction": 0.2},
    ),
    # Levers for time: the same tokens in half the steps of twice the sequences, so that
    # each optimizer step (Newton-Schulz included) and each eval, still every 40 and 20 steps, comes
    # half as often. The plan's fractions keep the stable phase at 245 steps and a 140-step anneal;
    # the warmup keeps its tokens.
    "batch32": (
        "32 sequences a step in half the steps (the same tokens)",
        "critical batch size (McCandlish et al. 2018)",
        BATCH32,
    ),
    # ... with both peak rates x sqrt(2), as for Adam the rate scales with the batch's square root.
    "batch32-lr": (
        "32 sequences a step in half the steps, both peak rates x 1.41",
        "square-root LR scaling (Malladi et al. 2022)",
        {**BATCH32, "pretrain.muon_lr": 0.028, "pretrain.lr": 0.0085},
    ),
    # Half the evals: every 80 stable and 40 anneal steps, the patience halved in evals so that early
    # stopping waits the same steps, and auto-anneal's stall window 4 evals (320 steps; 240 before).
    # The weights are the default's unless one of those decisions changes; the time is the lever.
    # Adopted (docs/recipe.md; its measured runs had a stall window of 3, which never fired either).
    "evals-half": (
        "an eval every 80 stable and 40 anneal steps (stall window 4, patience 2)",
        "the recipe's eval cost",
        {
            "pretrain.eval_every": 80,
            "pretrain.auto_anneal.stall_window": 4,
            "anneal.eval_every": 40,
            "anneal.patience": 2,
        },
    ),
}
DEFAULT = "default"


@functools.cache
def _params(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def in_default(settings: dict, project: Path) -> bool:
    """Whether the default of ``project``'s conf/base already has every one of ``settings``: its
    ledger row would compare the default with itself (as `layer-scalars` would now)."""
    for key, value in settings.items():
        path = key.lstrip("+").split(".")
        node = _params(project / FILES[path[0]])
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is None or node != yaml.safe_load(str(value)):
            return False
    return True


def ledger_runs(names: list[str], seeds: list[int]) -> dict[str, dict]:
    """Experiment name -> its settings: each of ``names`` (the default, an ingredient, or the
    combination of ingredients joined by +) at each seed."""
    check_seeds(seeds)
    out = {}
    for name in names:
        parts = [] if name == DEFAULT else name.split("+")
        unknown = [p for p in parts if p not in INGREDIENTS]
        if unknown:
            known = ", ".join(INGREDIENTS)
            raise ValueError(f"unknown ingredient(s) {', '.join(unknown)}: choose from {known}")
        settings = {k: v for p in parts for k, v in INGREDIENTS[p][2].items()}
        label = "+".join(parts) if parts else DEFAULT  # a combination names what it holds
        for seed in seeds:
            out[f"l-{label}-s{seed}"] = {**settings, **seed_settings(seed)}
    return out


def set_args(settings: dict) -> list[str]:
    """``-S file:key=value`` for each setting, in the file of its top-level key."""
    return [a for k, v in settings.items() for a in ("-S", f"{FILES[k.lstrip('+').split('.')[0]]}:{k}={v}")]


def queue_ledger(runs: dict[str, dict]) -> None:
    """Each run queued through ``lehr exp``, which checks every value as the stages would first."""
    for name, settings in runs.items():
        cmd = [sys.executable, "-m", "lehr", "exp", "--queue", "-n", name, *set_args(settings)]
        subprocess.run(cmd, check=True)


def ledger_table(project: Path) -> str:
    """The noise floor, then a row per ingredient (and the combination), from the experiments of
    the commit checked out."""
    runs: dict[str, dict[int, tuple[dict, Scored]]] = {}
    for name, sha in experiments_of(project, git(project, "rev-parse", "HEAD").strip()):
        label, _, seed = name.removeprefix("l-").rpartition("-s")
        if not (name.startswith("l-") and seed.isdigit()):
            continue  # another experiment of this commit
        metrics, items = figures(project, sha)
        if metrics and items:
            runs.setdefault(label, {})[int(seed)] = (metrics, Scored.from_record(items))
    defaults = runs.pop(DEFAULT, {})
    floor = noise_floor(
        {s: scored for s, (_, scored) in defaults.items()},
        {s: m["anneal"]["heldout"]["bpb"] for s, (m, _) in defaults.items()},
    )
    lines = [
        f"Noise floor: the default at seeds {', '.join(map(str, floor.bpb))}: held-out bits per byte "
        + ", ".join(f"{b:.4f}" for b in floor.bpb.values())
        + f" (sd {floor.spread:.4f}); the largest paired difference of two seeds {floor.floor:.4f}",
        "",
        "| seeds | B - A [95%] |",
        "| --- | --- |",
        *(
            f"| {i} vs {j} | {p['diff']:+.4f} [{p['lo']:+.4f}, {p['hi']:+.4f}] |"
            for (i, j), p in floor.pairs.items()
        ),
        "",
        "| ingredient | source | seeds | held-out bpb - default [95%] | verdict | tok/s vs default "
        "| stable + anneal time vs default |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    base_speed, base_time = _speed(DEFAULT, list(defaults)), _stage_time(DEFAULT, list(defaults))
    for label, seeded in runs.items():
        e = effect({s: sc for s, (_, sc) in defaults.items()}, {s: sc for s, (_, sc) in seeded.items()})
        parts = label.split("+")
        what = " + ".join(INGREDIENTS[p][0] for p in parts if p in INGREDIENTS)
        source = "; ".join(INGREDIENTS[p][1] for p in parts if p in INGREDIENTS)
        speed = _speed(label, e["seeds"])
        ratio = f"{speed / base_speed:.2f}x" if speed and base_speed else "- (no timed stable phase)"
        took = _stage_time(label, e["seeds"])
        time_ratio = f"{took / base_time:.2f}x" if took and base_time else "- (not timed)"
        lines.append(
            f"| {what} | {source} | {', '.join(map(str, e['seeds']))} | "
            f"{e['diff']:+.4f} [{e['lo']:+.4f}, {e['hi']:+.4f}] | {verdict(e, floor.floor)} | {ratio} "
            f"| {time_ratio} |"
        )
    return "\n".join(lines)


def _speed(label: str, seeds: list[int]) -> float | None:
    """The training tok/s of the fastest stable phase of ``label``'s runs at ``seeds``: another
    process on the machine only ever slows a run, so the fastest is the least disturbed
    (``bench/recipe_speed.py --ingredients`` measures the ratios side by side). A run that trained
    no stable phase (the baseline's own settings, or an anneal ingredient: DVC found the stage up
    to date) has no clock, and the others speak for the label."""
    clocks = [timing(f"l-{label}-s{s}", "pretrain_stable") for s in seeds]
    return max((c["tok_per_s"] for c in clocks if c), default=None)


def _stage_time(label: str, seeds: list[int]) -> float | None:
    """The wall seconds of the stable and anneal stages together (evals, checkpoints and compile
    included), of the quickest of ``label``'s runs at ``seeds`` that timed both, as ``_speed``."""
    times = []
    for seed in seeds:
        clocks = [timing(f"l-{label}-s{seed}", stage) for stage in ("pretrain_stable", "anneal")]
        if all(clocks):
            times.append(sum(c["wall_seconds"] for c in clocks))
    return min(times, default=None)


REPORTS = "data/08_reporting"
# r-baseline's final held-out bits per byte on the curves' measure, for checkouts
# that do not hold its experiment ref (experiment refs stay in the repository that ran them).
BASELINE_CURVE_FINAL = 1.856


def queue(names: list[str]) -> None:
    for name in names:
        # Each setting goes to the file of its top-level key (pretrain.* or anneal.*).
        settings = ROWS[name][1].items()
        sets = [a for k, v in settings for a in ("-S", f"{FILES[k.lstrip('+').split('.')[0]]}:{k}={v}")]
        subprocess.run(["dvc", "exp", "run", "--queue", "-n", name, *sets], check=True)


def _refs(name: str) -> list[str]:
    """The git refs of the experiments named ``name``, newest first."""
    refs = subprocess.run(
        ["git", "for-each-ref", "--sort=-committerdate", "--format=%(refname)", "refs/exps"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [r for r in refs if r.rsplit("/", 1)[-1] == name]


def _ref(name: str) -> str:
    found = _refs(name)
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
    target = (
        json.loads(_show(_ref("r-baseline"), f"{REPORTS}/anneal_metrics.json"))["heldout"]["bpb"]
        if _refs("r-baseline")
        else BASELINE_CURVE_FINAL  # a checkout without that experiment's ref
    )
    lines = [
        "| run | change | pre_anneal | anneal | Wikipedia | State of the Union | "
        f"first eval step at {target:.3f} | stable + anneal wall | training tok/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in names:
        ref = _ref(name)
        scored = json.loads(_show(ref, f"{REPORTS}/metrics.json"))
        curve = [
            *csv.DictReader(io.StringIO(_show(ref, f"{REPORTS}/stable_curve.csv"))),
            *csv.DictReader(io.StringIO(_show(ref, f"{REPORTS}/anneal_curve.csv"))),
        ]
        reached = first_step_at(curve, target)
        clock = {stage: timing(name, stage) for stage in ("pretrain_stable", "anneal")}
        if all(clock.values()):  # evals and checkpoints included
            wall = f"{sum(c['wall_seconds'] for c in clock.values()) / 60:.1f} min"
            tok_s = f"{clock['pretrain_stable']['tok_per_s']:,}"
        else:
            wall = tok_s = "- (no timing in this MLflow store)"
        pre, end = scored["pre_anneal"], scored["anneal"]
        lines.append(
            f"| {name} | {ROWS[name][0]} | {pre['heldout']['bpb']:.3f} | **{end['heldout']['bpb']:.3f}** | "
            f"{end['wikipedia']['bpb']:.3f} | {end['sotu']['bpb']:.3f} | "
            f"{reached if reached is not None else '-'} | {wall} | {tok_s} |"
        )
    return "\n".join(lines)


def timing(name: str, stage: str) -> dict | None:
    """The stage's data/08_reporting/timing/ file as the experiment's last finished MLflow run of
    that stage logged it (among its reports), or None."""
    import mlflow

    mlflow.set_tracking_uri("sqlite:///mlflow.db")  # conf/base/mlflow.yml's
    runs = mlflow.search_runs(
        experiment_names=["lehr"],
        filter_string=f"tags.`dvc.exp_name` = '{name}' and tags.`lehr.stage` = '{stage}' "
        "and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        output_format="list",
    )
    if not runs:
        return None
    file = "stable.json" if stage == "pretrain_stable" else "anneal.json"
    try:
        local = mlflow.artifacts.download_artifacts(
            run_id=runs[0].info.run_id, artifact_path=f"reports/{file}"
        )
    except mlflow.exceptions.MlflowException:
        # A store whose experiment a queued run created before lehr placed its artifacts beside the
        # store kept them in DVC's temporary workspace, which DVC has deleted since.
        return None
    return json.loads(Path(local).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["noise", "ledger", "combine", "ledger-table", "queue", "table"])
    parser.add_argument(
        "names", nargs="*", help="ingredients (ledger, combine) or history rows (queue, table)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, help="noise: 0 1 2; ledger and combine: 0 1")
    parser.add_argument("--dry-run", action="store_true", help="print the experiments, queue nothing")
    args = parser.parse_args()
    if args.action in ("noise", "ledger", "combine"):
        seeds = args.seeds or ([0, 1, 2] if args.action == "noise" else [0, 1])
        if missing := [f for f in FILES.values() if not (Path.cwd() / f).is_file()]:
            sys.exit(f"ablation: error: no {missing[0]} here: run it from the root of a lehr project")
        adopted = [n for n in INGREDIENTS if in_default(INGREDIENTS[n][2], Path.cwd())]
        names = {
            "noise": [DEFAULT],
            "ledger": args.names or [n for n in INGREDIENTS if n not in adopted],
            "combine": ["+".join(args.names)],
        }
        try:
            if args.action == "combine" and len(args.names) < 2:
                raise ValueError("combine takes two ingredients or more, e.g. combine relu2 normuon")
            if named := [n for n in args.names if n in adopted]:
                raise ValueError(
                    f"{', '.join(named)}: already in this commit's default (conf/base), so its run would be "
                    "the default's; leave it out (the default's rows have it), or measure it on a commit "
                    "from before it was adopted"
                )
            runs = ledger_runs(names[args.action], seeds)
        except ValueError as e:
            sys.exit(f"ablation: error: {e}")
        if args.dry_run:
            print("\n".join(f"{name}: {' '.join(set_args(settings))}" for name, settings in runs.items()))
        else:
            queue_ledger(runs)
    elif args.action == "ledger-table":
        try:
            print(ledger_table(Path.cwd()))
        except ValueError as e:
            sys.exit(f"ablation: error: {e}")
    elif args.action == "queue":
        queue(args.names or list(ROWS))
    else:
        print(table(args.names or list(ROWS)))


if __name__ == "__main__":
    main()
