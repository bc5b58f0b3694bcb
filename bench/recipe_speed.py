"""Benchmark: training tokens/s of the shipped default recipe (conf/base) against the recipe it
replaced (AdamW, fp32, cpu-demo as it was: 4 x 192 wide, 32 x 128-token batches), through lehr's own loop, in
interleaved rounds on this machine. Prints each and the ratio (issue goal: >= 1.15x).

    python bench/recipe_speed.py [--steps 40 --rounds 4]
    python bench/recipe_speed.py --ingredients [value-embeds relu2 ...]   # the ledger's, vs the default

With ``--ingredients`` (bench/ablation.py's; all of them when none is named), the default against
the default with each ingredient on, in the same interleaved rounds: the ledger's tok/s column,
measured side by side rather than from runs trained hours apart. An ingredient of the anneal alone
(tail averaging) leaves the stable phase's speed as it is, and one of the run's plan (the batch-size
warmup) is timed by its whole run: neither is timed here; one the default already
has (the residual scalars) is timed the other way, as the default without it.

Speed only: both train the default model size on random tokens with evals and checkpoints off
(the default run's logged tok/s leaves those out too).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from pathlib import Path

import yaml

from ablation import INGREDIENTS, MODEL
from lehr.engine.config import TrainConfig
from lehr.engine.hardware import resolve
from lehr.engine.model import preset
from synthetic import synthetic_shards
from train_loop import lehr_tok_s, speed_config

CONF = Path(__file__).resolve().parents[1] / "conf/base/parameters_pretrain_stable.yml"
# What the default run trained with before the recipe's ingredients: cpu-demo as it was then.
BEFORE = dict(
    preset="cpu-demo",
    overrides=dict(seq_len=128, n_layer=4, n_head=4, d_model=192, d_ff=512, qk_norm=False),
    optimizer="adamw",
    precision="fp32",
    compile=False,
    batch_size=32,
    micro_batch=16,
)


def default_recipe() -> dict:
    p = yaml.safe_load(CONF.read_text())["pretrain"]
    keys = ("optimizer", "precision", "compile", "batch_size", "micro_batch")
    return dict(preset=p["model"]["preset"], overrides=p["model"]["overrides"], **{k: p[k] for k in keys})


# An ingredient that sets these changes the run's plan (its steps, or its batch by step): its
# speed is the whole run's clock (docs/recipe.md gives the batch-size warmup's), not a window's.
PLAN = ("pretrain.planned_steps", "pretrain.batch_warmup_steps")


def with_ingredient(recipe: dict, settings: dict) -> dict | None:
    """``recipe`` with an ingredient's ``-S`` settings applied (model overrides, or TrainConfig
    fields as ``train``), or None for one of the anneal alone or of the run's plan."""
    if any(k.startswith("anneal.") or k in PLAN for k in settings):
        return None
    overrides, train = dict(recipe["overrides"]), dict(recipe.get("train", {}))
    for key, value in settings.items():
        value = yaml.safe_load(str(value))  # as Hydra reads "true", "15", "relu2"
        if key.startswith(f"{MODEL}."):
            overrides[key.removeprefix(f"{MODEL}.")] = value
        else:
            train[key.removeprefix("pretrain.")] = value
    return {**recipe, "overrides": overrides, "train": train}


def without_ingredient(recipe: dict, settings: dict) -> dict | None:
    """The default without an ingredient it already has: the model overrides it sets dropped (the
    preset's own values, off); None for one that sets a training field."""
    if not all(k.startswith(f"{MODEL}.") for k in settings):
        return None
    keys = {k.removeprefix(f"{MODEL}.") for k in settings}
    return {**recipe, "overrides": {k: v for k, v in recipe["overrides"].items() if k not in keys}}


def config(recipe: dict, shards: Path, out: Path, vocab: int, warmup: int, steps: int) -> TrainConfig:
    return speed_config(
        preset(recipe["preset"], vocab, **recipe["overrides"]),
        shards,
        out,
        batch=recipe["batch_size"],
        micro=recipe["micro_batch"],
        warmup=warmup,
        steps=steps,
        optimizer=recipe["optimizer"],
        precision=recipe["precision"],
        compile=recipe["compile"],
        **recipe.get("train", {}),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--ingredients", nargs="*", choices=list(INGREDIENTS), help="the default against each")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    now = default_recipe()
    if args.ingredients is None:
        runs, base = {"before": BEFORE, "default": now}, "before"
    else:
        runs, base = {"default": now}, "default"
        for name in args.ingredients or INGREDIENTS:
            recipe = with_ingredient(now, INGREDIENTS[name][2])
            if recipe is None:
                print(
                    f"{name:16} not timed: it changes the anneal alone (whose stable phase is the "
                    "default's) or the run's plan (its clock is the whole run's: docs/recipe.md)"
                )
            elif recipe != now:
                runs[name] = recipe
            elif (off := without_ingredient(now, INGREDIENTS[name][2])) is not None:
                runs[f"without-{name}"] = off  # in the default already: its cost is default / without
            else:
                print(f"{name:16} not timed: the default has it, and its off value is not the preset's")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shards = synthetic_shards(tmp / "shards", args.vocab)
        measured: dict[str, list[float]] = {name: [] for name in runs}
        # Interleaved, so drift in machine speed hits both alike, each first in every other round.
        for r in range(args.rounds):
            for name, recipe in list(runs.items())[:: 1 if r % 2 == 0 else -1]:
                cfg = config(recipe, shards, tmp / f"{name}{r}", args.vocab, args.warmup, args.steps)
                measured[name].append(lehr_tok_s(cfg)[0])
    for name, recipe in runs.items():
        cfg = config(recipe, Path(), Path(), args.vocab, args.warmup, args.steps)
        hw = resolve(cfg.device, cfg.precision, None)
        m = cfg.model
        print(
            f"{name:16} {statistics.median(measured[name]):8,.0f} tok/s   {cfg.optimizer}, {hw.precision}, "
            f"compile {cfg.compile}, {m.n_layer} x {m.d_model} wide, qk_norm {m.qk_norm}, "
            f"{cfg.batch_size} x {m.seq_len} tokens (micro {cfg.micro_batch})   "
            f"(rounds: {', '.join(f'{x:,.0f}' for x in measured[name])})"
        )
    for name in [n for n in runs if n != base]:
        ratio = statistics.median(measured[name]) / statistics.median(measured[base])
        print(f"ratio {name}/{base}  {ratio:.3f}x" + ("   (goal >= 1.15x)" if base == "before" else ""))


if __name__ == "__main__":
    main()
