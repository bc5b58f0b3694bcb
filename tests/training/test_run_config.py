"""Stage params -> engine configs: the stable stop rule, anneal branches, the cosine baseline."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from lehr.params.stages import AnnealParams, PretrainParams
from lehr.training.folder_names import branch_name
from lehr.training.train_config import anneal_config, stable_config
from tests import ROOT

MANIFEST = {"root": "/shards", "tokenizer": {"vocab_size": 512, "sha256": "x"}}
PROV = {"manifest_sha256": "m"}


def params(section: str, file: str, **changes):
    """The base params, with the budget pinned so the figures below do not follow the defaults."""
    raw = yaml.safe_load((ROOT / f"conf/base/{file}").read_text())[section]
    if section == "pretrain":
        raw |= {
            "planned_steps": 800,
            "planned_decay_fraction": 0.2,
            "auto_anneal": {**raw["auto_anneal"], "min_fraction": 0.5, "max_fraction": 0.9},
        }
        return PretrainParams(**{**raw, **changes})
    return AnnealParams(**{**raw, "decay_steps": 0, "decay_fraction": 0.2, **changes})


@pytest.fixture
def pre_anneal(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"progress": {"step": 640}}))
    return tmp_path


def test_stable_run_stops_at_the_planned_or_auto_anneal_start(tmp_path):
    p = params("pretrain", "parameters_pretrain_stable.yml")
    cfg = stable_config(p, MANIFEST, tmp_path, PROV)
    assert cfg.stop_rule.planned_step == 640 and cfg.stop_rule.auto
    assert cfg.stop_rule.min_step == 400 and cfg.stop_rule.max_step == 720
    assert cfg.anneal_start is None  # open-ended stable phase
    assert cfg.model.vocab_size == 512


def test_the_stable_phase_bounds_are_rounded_not_truncated(tmp_path):
    # 700 * 0.7 is 489.99999999999994 in floating point: the shipped recipe's cap is step 490.
    aa = {"enabled": True, "min_fraction": 0.7, "max_fraction": 0.7, "stall_window": 6, "stall_eps": 0.005}
    p = params("pretrain", "parameters_pretrain_stable.yml", planned_steps=700, auto_anneal=aa)
    rule = stable_config(p, MANIFEST, tmp_path, PROV).stop_rule
    assert rule.min_step == rule.max_step == 490


def test_stable_runs_of_other_configs_or_data_get_their_own_folder(tmp_path):
    p = params("pretrain", "parameters_pretrain_stable.yml")
    base = stable_config(p, MANIFEST, tmp_path, PROV)
    assert base.out_dir == stable_config(p, MANIFEST, tmp_path, PROV).out_dir  # same params resume
    assert base.stop_rule.save_to == f"{base.out_dir}/pre_anneal"
    others = [
        stable_config(dataclasses.replace(p, lr=1e-3), MANIFEST, tmp_path, PROV),
        stable_config(dataclasses.replace(p, schedule="cosine"), MANIFEST, tmp_path, PROV),
        stable_config(p, MANIFEST, tmp_path, {"manifest_sha256": "other data"}),
    ]
    assert len({base.out_dir, *(o.out_dir for o in others)}) == 4
    assert (
        stable_config(dataclasses.replace(p, run_name="main"), MANIFEST, tmp_path, PROV).out_dir
        == f"{tmp_path}/main"
    )


def test_wsd_anneal_decays_for_its_own_length_from_pre_anneal(tmp_path, pre_anneal):
    p, a = params("pretrain", "parameters_pretrain_stable.yml"), params("anneal", "parameters_anneal.yml")
    cfg = anneal_config(p, a, MANIFEST, pre_anneal, tmp_path, {})
    assert (cfg.anneal_start, cfg.anneal_steps, cfg.end_step) == (640, 160, 800)
    assert cfg.init_from == str(pre_anneal) and cfg.data_seed != p.data_seed
    assert cfg.patience_from_step == 720  # mid-decay


def test_cosine_baseline_spends_the_same_budget_in_one_schedule(tmp_path, pre_anneal):
    p = params("pretrain", "parameters_pretrain_stable.yml", schedule="cosine")
    a = params("anneal", "parameters_anneal.yml")
    stable = stable_config(p, MANIFEST, tmp_path, PROV)
    assert not stable.stop_rule.auto and stable.stop_rule.planned_step == 640
    cfg = anneal_config(p, a, MANIFEST, pre_anneal, tmp_path, {})
    assert cfg.schedule == "cosine" and cfg.end_step == p.planned_steps
    assert branch_name(p, a).startswith("cosine-")


def test_a_branch_from_another_profiles_pre_anneal_names_the_profile_to_use(tmp_path, pre_anneal):
    p, a = params("pretrain", "parameters_pretrain_stable.yml"), params("anneal", "parameters_anneal.yml")
    made = stable_config(
        dataclasses.replace(p, model={"preset": "tiny", "overrides": {}}), MANIFEST, tmp_path, PROV
    )
    (pre_anneal / "state.json").write_text(
        json.dumps({"progress": {"step": 640}, "provenance": {"profile": "smoke"}, "config": made.to_dict()})
    )
    with pytest.raises(
        ValueError, match="made under the smoke profile.*`kedro run --pipelines anneal --env smoke`"
    ):
        anneal_config(p, a, MANIFEST, pre_anneal, tmp_path, {"profile": "local"})
    anneal_config(
        p, a, MANIFEST, pre_anneal, tmp_path, {"profile": "smoke"}
    )  # the same profile: the engine decides


def test_branch_names_follow_the_params():
    p, a = params("pretrain", "parameters_pretrain_stable.yml"), params("anneal", "parameters_anneal.yml")
    assert branch_name(p, a) != branch_name(p, dataclasses.replace(a, shape="linear"))
    assert branch_name(p, dataclasses.replace(a, branch="gold-1sqrt")) == "gold-1sqrt"


def test_nothing_listens_beyond_loopback_by_default():
    assert "127.0.0.1" in (ROOT / "conf/base/parameters_pretrain_stable.yml").read_text()
    assert "--host 127.0.0.1" in (ROOT / "Makefile").read_text()
    for path in [*ROOT.glob("conf/**/*.yml"), ROOT / "Makefile", *ROOT.glob("src/**/*.py")]:
        assert "0.0.0.0" not in path.read_text(), path


def test_a_stage_across_machines_runs_on_node_0_under_the_static_rendezvous():
    from lehr.engine.config import Launch
    from lehr.training.job import check_stage_node

    check_stage_node(Launch())
    check_stage_node(Launch(nnodes=2, node_rank=0))
    check_stage_node(Launch(nnodes=2, node_rank=1), helper=True)
    with pytest.raises(ValueError, match="python -m lehr join <stage>"):
        check_stage_node(Launch(nnodes=2, node_rank=1))
    with pytest.raises(ValueError, match="node 0 runs the stage itself"):
        check_stage_node(Launch(nnodes=2, node_rank=0), helper=True)
    with pytest.raises(ValueError, match="node 0 runs the stage itself"):
        check_stage_node(Launch(), helper=True)
    with pytest.raises(ValueError, match="needs `static`"):
        check_stage_node(Launch(nnodes=2, rdzv_backend="c10d"))


def test_branch_points_are_whole_steps_within_the_stable_phase(tmp_path):
    p = params("pretrain", "parameters_pretrain_stable.yml", branch_points=[819200, 409600])
    rule = stable_config(p, MANIFEST, tmp_path, PROV).stop_rule
    assert rule.keep == (100, 200) and rule.keep_to == f"{Path(rule.save_to).parent}/branch_points"
    # Keeping checkpoints changes no step: the same run folder as without them.
    plain = stable_config(params("pretrain", "parameters_pretrain_stable.yml"), MANIFEST, tmp_path, PROV)
    assert plain.out_dir == stable_config(p, MANIFEST, tmp_path, PROV).out_dir
    off_step = params("pretrain", "parameters_pretrain_stable.yml", branch_points=[5000])
    with pytest.raises(
        ValueError, match="5000 tokens, not a whole number of steps of 4096 tokens.*use 4096 or 8192"
    ):
        stable_config(off_step, MANIFEST, tmp_path, PROV)
    under_one = params("pretrain", "parameters_pretrain_stable.yml", branch_points=[1000])
    with pytest.raises(ValueError, match=r"1000 tokens, not a whole number.*: use 4096$"):
        stable_config(under_one, MANIFEST, tmp_path, PROV)
    # Auto-anneal may stop the stable phase at its min_step (400): a point after it might never come.
    late = params("pretrain", "parameters_pretrain_stable.yml", branch_points=[401 * 4096])
    with pytest.raises(ValueError, match=r"\(step 401\), past the stable phase: it surely runs to step 400"):
        stable_config(late, MANIFEST, tmp_path, PROV)
    # With a batch-size warmup (4, 8, 12 sequences for 35 steps each, then 16) a step's tokens
    # vary: 35 x 4 x 256 tokens end step 35, and a point between steps names the two around it.
    ramp = dict(batch_warmup_steps=105, batch_warmup_start=4)
    warm = params("pretrain", "parameters_pretrain_stable.yml", branch_points=[140 * 256, 1720 * 256], **ramp)
    assert stable_config(warm, MANIFEST, tmp_path, PROV).stop_rule.keep == (35, 160)
    between = params("pretrain", "parameters_pretrain_stable.yml", branch_points=[142 * 256], **ramp)
    with pytest.raises(
        ValueError, match=r"fewer in the first 105, the batch-size warmup\): use 35840 or 37888$"
    ):
        stable_config(between, MANIFEST, tmp_path, PROV)
    with pytest.raises(
        ValueError, match="pretrain.branch_points = \\[-1\\] must be a list of positive token"
    ):
        params("pretrain", "parameters_pretrain_stable.yml", branch_points=[-1])


def test_a_branch_from_a_branch_point_decays_by_its_ratio_and_is_named_for_it(tmp_path, pre_anneal):
    p = params("pretrain", "parameters_pretrain_stable.yml")
    a = params("anneal", "parameters_anneal.yml", origin="tokens-819200", decay_ratio=0.25)
    (pre_anneal / "state.json").write_text(json.dumps({"progress": {"step": 200}}))
    cfg = anneal_config(p, a, MANIFEST, pre_anneal, tmp_path, {})
    assert (cfg.anneal_start, cfg.anneal_steps, cfg.end_step) == (200, 50, 250)
    assert branch_name(p, a).startswith("tokens-819200-1-sqrt-r0.25-")
    with pytest.raises(ValueError, match="decay_ratio = 0.25 and decay_steps = 10 both set"):
        params("anneal", "parameters_anneal.yml", decay_ratio=0.25, decay_steps=10)


def test_the_default_branch_keeps_the_name_it_had_before_branch_points():
    """Settings added later leave a branch's derived name as it was, at their "off" values: the
    name the committed metrics.json holds for the default run."""
    import yaml

    base = {
        s: yaml.safe_load((ROOT / f"conf/base/parameters_{f}.yml").read_text())[s]
        for s, f in (("pretrain", "pretrain_stable"), ("anneal", "anneal"))
    }
    committed = json.loads((ROOT / "data/08_reporting/metrics.json").read_text())["anneal"]["branch"]
    assert branch_name(PretrainParams(**base["pretrain"]), AnnealParams(**base["anneal"])) == committed


def test_an_origin_must_be_a_branch_point_of_pre_anneals_own_stable_run(tmp_path):
    from lehr.training.job import origin_of

    def checkpoint(path, run):
        path.mkdir(parents=True)
        (path / "state.json").write_text(json.dumps({"config": {"out_dir": run}}))
        return path

    pre = checkpoint(tmp_path / "pre_anneal", "stable_run/auto-a")
    ours = checkpoint(tmp_path / "branch_points/tokens-512", "stable_run/auto-a")
    theirs = checkpoint(tmp_path / "old/tokens-1024", "stable_run/auto-b")
    a = params("anneal", "parameters_anneal.yml")
    assert origin_of(a, pre, {}) == pre
    assert origin_of(dataclasses.replace(a, origin="tokens-512"), pre, {"tokens-512": ours}) == ours
    with pytest.raises(
        ValueError, match="names no branch point of the stable run; its branch points are: tokens-512"
    ):
        origin_of(dataclasses.replace(a, origin="tokens-9"), pre, {"tokens-512": ours})
    with pytest.raises(ValueError, match=r"kept by another stable run \(stable_run/auto-b\)"):
        origin_of(dataclasses.replace(a, origin="tokens-1024"), pre, {"tokens-1024": theirs})
