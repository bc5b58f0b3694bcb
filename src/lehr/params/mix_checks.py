"""The data mixes' tiers against the data there is (the corpus's tiers, or without a corpus the
shards'), checked before any work: by ``lehr check`` and ``lehr exp`` before anything runs, and by
every Kedro run that trains (``hooks.config_in_force``), naming the parameter. Plain
Python: every stage's hooks import it, so it imports nothing of the engine."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from lehr.paths import portable

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
    typed = dataclasses.is_dataclass(value) and not isinstance(value, type)
    return dataclasses.asdict(value) if typed else value


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


def corpus_problems(corpus: Path) -> list[str]:
    """Entries of the corpus that are no files to read (a FIFO, a device, a socket)."""
    from lehr.dataprep.corpus import special_files

    return special_files(corpus) if corpus.is_dir() else []


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
