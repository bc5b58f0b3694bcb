"""`python -m lehr check` validates every stage's params, as the stages would, before DVC runs one."""

from __future__ import annotations

import json
import shutil

import pytest

from lehr.__main__ import main
from lehr.config_parts import from_mapping
from lehr.dataprep.params import ShardParams
from lehr.params.stages import AnnealParams, PretrainParams
from tests import ROOT


@pytest.fixture
def conf(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    shutil.copy2(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "conf"


def test_check_passes_the_shipped_profiles_and_names_a_bad_value(conf, capsys):
    assert main(["check", "--env", "smoke"]) == 0 and main(["check", "--env", "gpu"]) == 0
    path = conf / "base" / "parameters_pretrain_stable.yml"
    path.write_text(path.read_text().replace("  lr: ", "  lr: abc # ", 1))
    assert main(["check", "--env", "smoke"]) == 2
    assert "parameter pretrain.lr = 'abc' has the wrong type" in capsys.readouterr().err


def test_check_reads_the_ladder_section_too(conf, capsys):
    path = conf / "smoke" / "parameters_ladder.yml"  # the profile's own ladder overrules conf/base's
    path.write_text(path.read_text().replace("  decay_ratio: ", "  decay_ratio: 1.5 # ", 1))
    assert main(["check", "--env", "smoke"]) == 2
    assert "ladder.decay_ratio = 1.5 must lie in (0, 1]" in capsys.readouterr().err


def _with(cls, section: str, **change):
    import yaml

    base = yaml.safe_load((ROOT / f"conf/base/parameters_{section}.yml").read_text())
    key = next(iter(base))
    return cls(**{**base[key], **change})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"seed": -1}, r"pretrain.seed = -1 is out of range"),
        ({"data_seed": 2**32}, r"pretrain.data_seed = 4294967296 is out of range"),
        ({"eval_windows": 0}, r"pretrain.eval_windows = 0 must be positive"),
        ({"stable_mix": {"gold": 0.0}}, r"pretrain.stable_mix.gold = 0.0 must be a positive number"),
        ({"stable_mix": {"gold": -1}}, r"pretrain.stable_mix.gold = -1 must be a positive number"),
        ({"stable_mix": {"gold": "lots"}}, r"pretrain.stable_mix.gold = 'lots' must be a positive number"),
    ],
)
def test_bad_pretrain_values_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        _with(PretrainParams, "pretrain_stable", **change)


@pytest.mark.parametrize(
    "mix, message",
    [
        (
            [[1.0, {"gold": 1}], [0.5, {"silver": 1}]],
            r"end fractions \[1.0, 0.5\]: they must rise strictly within \(0, 1\]",
        ),
        ([[1.5, {"gold": 1}]], r"end fractions \[1.5\]: they must rise"),
        ([[1.0, {"gold": 0}]], r"anneal.mix\[0\].gold = 0 must be a positive number"),
    ],
)
def test_bad_anneal_phases_are_named(mix, message):
    with pytest.raises(ValueError, match=message):
        _with(AnnealParams, "anneal", mix=mix)


def test_the_engine_refuses_a_bad_anneal_mix_too():
    """The phases are checked by the engine's own parts, whichever way a config is built."""
    from lehr.config_parts import ConfigError
    from lehr.engine.config import BranchConfig, DecayConfig

    with pytest.raises(ConfigError, match=r"anneal_mix = .* end fractions \[0.5, 0.2\]"):
        DecayConfig(anneal_mix=[[0.5, {"gold": 1}], [0.2, {"gold": 1}]])
    with pytest.raises(ConfigError, match=r"mix\[0\].gold = -1 must be a positive number"):
        BranchConfig(mix=[[1.0, {"gold": -1}]])


@pytest.mark.parametrize(
    "cls, section, old, new",
    [
        (PretrainParams, "pretrain_stable", "decay_fraction", "planned_decay_fraction"),
        (ShardParams, "shard", "task_examples", "builtin_task_examples"),
    ],
)
def test_a_renamed_key_is_refused_naming_its_new_name(cls, section, old, new, conf, capsys):
    """An old key must not be dropped in silence (its value would give way to the default): Kedro's
    own construction, `lehr check` and the params loader all name the new key."""
    import yaml

    base = yaml.safe_load((ROOT / f"conf/base/parameters_{section}.yml").read_text())
    key = next(iter(base))
    raw = {k: v for k, v in base[key].items() if k != new} | {old: base[key][new]}
    message = f"parameter {key}.{old} = {base[key][new]!r} was renamed: write {new} instead"
    with pytest.raises(ValueError, match=message):
        cls(**raw)
    with pytest.raises(ValueError, match=message):
        from_mapping(cls, raw, key)
    path = conf / "base" / f"parameters_{section}.yml"
    path.write_text(path.read_text().replace(f"  {new}:", f"  {old}:", 1))
    assert main(["check", "--env", "smoke"]) == 2
    assert message in capsys.readouterr().err


def test_a_context_no_shard_can_hold_is_refused_naming_the_key_and_the_stream(tmp_path):
    from lehr.params.check import context_problems

    streams = {"train/gold": {"shards": [{"n_tokens": 100}, {"n_tokens": 50}]}}
    (tmp_path / "manifest.json").write_text(json.dumps({"streams": streams}))
    assert context_problems(99, tmp_path) == []  # a window of 100 tokens fits the first shard
    (problem,) = context_problems(100, tmp_path)
    assert (
        "pretrain.model.overrides.seq_len" in problem
        and "train/gold" in problem
        and "longest: 100" in problem
    )
    assert context_problems(100, tmp_path / "none") == []  # no shards yet: nothing to check against
