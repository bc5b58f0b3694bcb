"""`python -m lehr check`: every section of the project's parameters validated as its stage
would, before DVC runs one, and against the data the project has now (``problems_of``). Apart
from ``lehr.params.stages`` so that the stages, which import that, do not depend on the ladder's
params."""

from __future__ import annotations

import json
from pathlib import Path

from lehr.config_parts import from_mapping
from lehr.params.ladder import LadderParams
from lehr.params.stages import SECTIONS

# Read by `make ladder` alone, so a project without the ladder's params still checks clean.
OPTIONAL_SECTIONS = {"ladder": LadderParams}


def check_all(parameters: dict) -> list[str]:
    """Every section of a resolved parameters mapping, validated; returns the problems found."""
    problems = []
    sections = {**SECTIONS, **{k: v for k, v in OPTIONAL_SECTIONS.items() if k in parameters}}
    for section, cls in sections.items():
        if section not in parameters:
            problems.append(f"parameter section {section} is missing")
            continue
        try:
            from_mapping(cls, parameters[section], section)
        except (TypeError, ValueError) as e:
            problems.append(str(e))
    return problems


def load_parameters(conf: Path, env: str) -> dict:
    from kedro.config import OmegaConfigLoader

    loader = OmegaConfigLoader(
        conf_source=str(conf), base_env="base", default_run_env=env, merge_strategy={"parameters": "soft"}
    )
    return loader["parameters"]


def pretrain_problems(parameters: dict, shards: Path) -> list[str]:
    """The branch points against the planned stable phase and, with shards, the model's vocabulary
    against their tokenizer's: what ``stable_config`` would refuse."""
    from lehr.engine.model import preset
    from lehr.params.mix_checks import section
    from lehr.params.stages import PretrainParams
    from lehr.training.train_config import branch_point_steps, model_config, stop_rule

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
        branch_point_steps(p, model.seq_len, stop_rule(p))
    except ValueError as e:
        return [str(e)]
    return context_problems(model.seq_len, shards)


def context_problems(seq_len: int, shards: Path) -> list[str]:
    """A context longer than every shard of a stream (the engine's rule: a window needs seq_len + 1
    tokens of one shard), checked against the manifest without opening a shard."""
    manifest = shards / "manifest.json"
    streams = json.loads(manifest.read_text())["streams"] if manifest.is_file() else {}
    return [
        f"parameter pretrain.model.overrides.seq_len (the model's context, {seq_len} tokens) is longer than "
        f"every shard of {name} in {shards} (longest: {max(s['n_tokens'] for s in entry['shards'])} tokens): "
        "lower it, or raise shard.shard_tokens and run shard again"
        for name, entry in streams.items()
        if entry.get("shards") and max(s["n_tokens"] for s in entry["shards"]) <= seq_len
    ]


def problems_of(project: Path, env: str, conf: Path | None = None) -> list[str]:
    """Every problem a stage would find with the params in ``conf`` (default: the project's), checked
    against the data the project has now."""
    from lehr.params.mix_checks import corpus_problems, mix_problems
    from lehr.params.tracked import untracked
    from lehr.paths import catalog_paths

    parameters = load_parameters(conf or project / "conf", env)
    paths = catalog_paths(project, env)
    problems = (
        check_all(parameters)
        + mix_problems(parameters, paths["corpus"], paths["shards"])
        + corpus_problems(paths["corpus"])
    )
    problems += pretrain_problems(parameters, paths["shards"])
    return problems + untracked(project, env)
