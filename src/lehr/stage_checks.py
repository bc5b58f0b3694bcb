"""The checks a stage makes once its data exists, made before any work with whatever data is
there: the data mixes' tiers against the corpus's (or, without a corpus, the shards'), the branch
points against the planned stable phase, the model's vocabulary against the tokenizer's.

``lehr check``, ``lehr exp`` and every Kedro run (``conf_visibility.ConfigInForce``) call them,
so a value the training stages would refuse is refused in seconds, before tokenize and shard run
and before DVC removes or rewrites anything.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from lehr.config_parts import from_mapping
from lehr.params import PretrainParams
from lehr.project import portable

HELDOUT = "heldout"  # the corpus folder of held-out text, not a tier


def tiers_on_disk(corpus: Path, shards: Path) -> tuple[list[str], str] | None:
    """The tiers the next training run will have, and where they were read; None if neither is there."""
    if corpus.is_dir():
        tiers = [p.name for p in corpus.iterdir() if p.is_dir() and not p.name.startswith(".")]
        return sorted(t for t in tiers if t != HELDOUT), f"the corpus ({portable(corpus)})"
    manifest = shards / "manifest.json"
    if manifest.is_file():
        streams = json.loads(manifest.read_text())["streams"]
        return sorted(
            s.split("/", 1)[1] for s in streams if s.startswith("train/")
        ), f"the shards ({portable(shards)})"
    return None


def section(parameters: dict, key: str) -> dict:
    """A section as a mapping, whether still YAML's or already its typed params (Kedro's context
    holds them so once a pipeline's nodes asked for them typed)."""
    value = parameters.get(key, {})
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def mixes(parameters: dict) -> dict[str, dict]:
    """Every data mix of the params, by its key in full."""
    out = {}
    stable = section(parameters, "pretrain").get("stable_mix")
    if isinstance(stable, dict):
        out["pretrain.stable_mix"] = stable
    for i, phase in enumerate(section(parameters, "anneal").get("mix") or []):
        if isinstance(phase, (list, tuple)) and len(phase) == 2 and isinstance(phase[1], dict):
            out[f"anneal.mix[{i}]"] = phase[1]
    return out


def mix_problems(parameters: dict, corpus: Path, shards: Path) -> list[str]:
    found = tiers_on_disk(corpus, shards)
    if found is None or not found[0]:
        return []
    tiers, where = found
    return [
        f"parameter {key} names tier {tier!r}, but {where} holds the tiers {', '.join(tiers)}: name one of "
        "them (a tier is a folder of the corpus)"
        for key, mix in mixes(parameters).items()
        for tier in mix
        if tier not in tiers
    ]


def pretrain_problems(parameters: dict, shards: Path) -> list[str]:
    """The branch points against the planned stable phase and, with shards, the model's vocabulary
    against their tokenizer's: what ``stable_config`` would refuse."""
    from lehr.engine.model import preset
    from lehr.run_config import branch_point_steps, model_config, stop_rule

    try:
        p = from_mapping(PretrainParams, section(parameters, "pretrain"), "pretrain")
    except (KeyError, TypeError, ValueError):
        return []  # ``check_all`` names what is wrong with the section itself
    manifest_file = shards / "manifest.json"
    try:
        if manifest_file.is_file():
            manifest = {**json.loads(manifest_file.read_text()), "root": str(shards)}
            model = model_config(p, manifest)
        else:  # no tokenizer yet: any vocabulary gives the context length
            model = preset(p.model.preset, p.model.vocab_size or 256, **p.model.overrides)
        branch_point_steps(p, p.batch_size, model.seq_len, stop_rule(p))
    except ValueError as e:
        return [str(e)]
    return []


def data_problems(parameters: dict, corpus: Path, shards: Path) -> list[str]:
    return mix_problems(parameters, corpus, shards) + pretrain_problems(parameters, shards)
