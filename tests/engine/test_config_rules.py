"""The config's rules are declared on its fields (``config_parts.setting``): which settings a resume
may change, which value means "not in use", what a key was called before. These tests hold the
declarations to the fields they name and pin what the math hash covers."""

import dataclasses

import pytest

from lehr.config_parts import Part, not_in_use, renames, resumable
from lehr.dataprep.params import ShardParams
from lehr.engine.config import TrainConfig
from lehr.engine.model import ModelConfig, preset
from lehr.params.stages import AnnealParams, PretrainParams


def _parts() -> set[type]:
    todo, seen = [Part], set()
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen and sub.__module__.startswith("lehr."):
                seen.add(sub)
                todo.append(sub)
    return seen | {ModelConfig}


def _config(**kw) -> TrainConfig:
    return TrainConfig(**{"model": preset("tiny", 256), "shards": "s", "out_dir": "o", **kw})


def test_every_declared_rule_names_a_field_of_its_config():
    classes = _parts()
    assert {TrainConfig, PretrainParams, AnnealParams, ShardParams} <= classes
    for cls in classes:
        names = {f.name for f in dataclasses.fields(cls)}
        assert resumable(cls) <= names
        for old, new in renames(cls).items():
            assert new in names, (cls, old)
        for f in dataclasses.fields(cls):
            assert set(f.metadata) <= {"resumable", "off", "used_if", "renamed_from"}, (cls, f.name)
    # used_if reads the config's own fields: under either optimizer and either spike setting
    for kw in ({}, {"optimizer": "adamw"}, {"spike_sigma": 2.0}):
        not_in_use(_config(**kw))


def test_the_renames_are_the_ones_users_met():
    assert renames(TrainConfig) == {"total_steps": "planned_steps"}
    assert renames(PretrainParams) == {
        "total_steps": "planned_steps",
        "decay_fraction": "planned_decay_fraction",
    }
    assert renames(ShardParams) == {"task_examples": "builtin_task_examples"}


MATH = {
    "anneal_mix", "anneal_start", "anneal_steps", "batch_size", "beta1", "beta2", "data_seed",
    "decay_shape", "grad_clip", "lr", "min_lr", "model", "precision", "schedule", "seed",
    "stable_mix", "warmup_steps", "weight_decay",
}  # fmt: skip


@pytest.mark.parametrize(
    "kw, extra",
    [
        ({"optimizer": "adamw"}, set()),
        ({}, {"optimizer", "muon_lr", "muon_momentum", "muon_weight_decay"}),
        (
            {"optimizer": "adamw", "z_loss": 1e-4, "spike_sigma": 2.0},
            {"z_loss", "spike_sigma", "spike_window"},
        ),
    ],
)
def test_the_math_hash_covers_the_math_and_only_settings_in_use(kw, extra):
    """A resumable setting never enters the hash; one at its "not in use" value stays out, so that
    checkpoints from before it existed still resume."""
    cfg = _config(**kw)
    assert set(cfg.math_fields()) == MATH | extra
    assert "n_kv_head" not in cfg.math_fields()["model"]
    grouped = _config(**kw, model=dataclasses.replace(preset("tiny", 256), n_kv_head=1))
    assert grouped.math_fields()["model"]["n_kv_head"] == 1


# Values from before the rules were declared on the fields (2026-12-02, commit 8d0dde1): a run
# folder's name and an exact resume go by these, so a change to them strands every run.
PINNED_HASHES = {
    (("optimizer", "muon"),): "fac057e4d61391c5",
    (("optimizer", "adamw"),): "e23b90f6a0b2e91f",
    (("optimizer", "adamw"), ("z_loss", 1e-4), ("spike_sigma", 2.0)): "620562ab43ed62b4",
    (
        ("optimizer", "muon"),
        ("z_loss", 1e-4),
        ("spike_sigma", 2.0),
        ("muon_work", "redundant"),
        ("micro_batch", 4),
    ): ("ae27e63e995e2f2c"),
}
# The default's branch names: its anneal's params are in them, so they changed once on purpose, when
# the default's anneal went to an eval every 40 steps and patience 2 (2026-12-05; before: ae5d57,
# 82e229, 12da8e, 16177b).
PINNED_BRANCHES = {
    ("pre_anneal", 0.0, 0): "1-sqrt-280-61b934",
    ("pre_anneal", 0.0, 50): "1-sqrt-50-86b8f7",
    ("pre_anneal", 0.2, 0): "1-sqrt-r0.2-f08c1e",
    ("tokens-4096", 0.0, 0): "tokens-4096-1-sqrt-280-f85c45",
}


@pytest.mark.parametrize("settings", list(PINNED_HASHES), ids=[str(len(k)) for k in PINNED_HASHES])
def test_the_math_hash_of_a_config_is_what_it_was(settings):
    assert _config(**dict(settings)).math_hash() == PINNED_HASHES[settings]


@pytest.mark.parametrize("origin, ratio, steps", list(PINNED_BRANCHES))
def test_a_branch_keeps_its_name(origin, ratio, steps):
    import yaml

    from lehr.training.folder_names import branch_name
    from tests import ROOT

    pretrain = yaml.safe_load((ROOT / "conf/base/parameters_pretrain_stable.yml").read_text())["pretrain"]
    anneal = yaml.safe_load((ROOT / "conf/base/parameters_anneal.yml").read_text())["anneal"]
    branch = AnnealParams(**{**anneal, "origin": origin, "decay_ratio": ratio, "decay_steps": steps})
    assert branch_name(PretrainParams(**pretrain), branch) == PINNED_BRANCHES[origin, ratio, steps]
