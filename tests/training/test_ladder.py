"""The micro ladder: 3 sizes x 2 budgets of the tiny model on the smoke shards, trained through
lehr.training.ladder_rungs as the ladder's stages train it, fitted, plotted and predicted from; and the
ladder's refusals of bad input."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from kedro.config import OmegaConfigLoader

from lehr.__main__ import main
from lehr.catalog import ShardsDataset
from lehr.config_parts import from_mapping
from lehr.engine.model import preset
from lehr.params.ladder import LadderParams
from lehr.params.stages import AnnealParams, PretrainParams
from lehr.pipelines.ladder_fit.nodes import fit_ladder
from lehr.reports.scaling_fit import GRID, FitError, Law, fit, predict
from lehr.training.ladder_rungs import family_gaps, recipe_overrides, rung_params, train_rung
from tests import ROOT

MICRO = {
    "sizes": [1, 2, 3],
    "rung": 0,
    "shape": {"preset": "tiny", "aspect_ratio": 32, "head_dim": 16, "seq_len": 64},
    "budgets": [5120, 10240],  # steps 10 and 20 of 8 x 64 tokens
    "decay_ratio": 0.5,
    "flop_budgets": [1.0e10],
    "bootstrap": 20,
}


def params_of(profile: str) -> dict:
    """Every stage's params as `kedro run --env <profile>` reads them."""
    return OmegaConfigLoader(
        conf_source=str(ROOT / "conf"),
        base_env="base",
        default_run_env=profile,
        merge_strategy={"parameters": "soft"},
    )["parameters"]


@pytest.fixture(scope="module")
def recipe():
    """The smoke profile's stable and anneal params."""
    params = params_of("smoke")
    return (
        from_mapping(PretrainParams, params["pretrain"], "pretrain"),
        from_mapping(AnnealParams, params["anneal"], "anneal"),
    )


def test_a_micro_ladder_trains_fits_plots_and_predicts(recipe, smoke_shards, tmp_path, capsys):
    pretrain, anneal = recipe
    pretrain = dataclasses.replace(pretrain, eval_every=10, task_examples=0, sample_tokens=0, eval_windows=4)
    ladder = from_mapping(LadderParams, MICRO, "ladder")
    shards = ShardsDataset(str(smoke_shards)).load()
    rungs = [
        train_rung(pretrain, anneal, ladder, d, shards, tmp_path / f"rung-{d}", {}) for d in ladder.sizes
    ]
    for rung in rungs:
        assert [e["tokens"] for e in rung["endpoints"]] == [5120 + 2560, 10240 + 5120]
        assert [e["origin"] for e in rung["endpoints"]] == ["tokens-5120", "pre_anneal"]
    assert rungs[0]["n_params"] < rungs[1]["n_params"] < rungs[2]["n_params"]
    # Run again, the ladder trains nothing: every run resumes at its end.
    again = train_rung(pretrain, anneal, ladder, 1, shards, tmp_path / "rung-1", {})
    assert again == rungs[0]

    fitted, _ = fit_ladder(dict(zip(ladder.sizes, rungs, strict=True)), ladder)
    assert fitted["status"] == "fitted" and len(fitted["points"]) == 6
    # The recipe's model overrides (the smoke profile's: the residual scalars) reached every rung.
    assert pretrain.model.overrides == {"layer_scalars": True}
    assert all(r["overrides"] == {"layer_scalars": True} for r in rungs)
    assert fitted["family"] == {
        "shape": {**MICRO["shape"], "depth_offset": 0},
        "overrides": {"layer_scalars": True},
        "depths": [1, 2, 3],
        "decay_ratio": 0.5,
    }
    assert fitted["holdout"]["status"].startswith("not fitted")  # 4 endpoints left: too few to fit
    path = tmp_path / "ladder.json"
    path.write_text(json.dumps(fitted))
    big = rungs[-1]["endpoints"][-1]
    assert (
        main(
            [
                "ladder",
                "predict",
                "--params",
                str(rungs[-1]["n_params"]),
                "--tokens",
                str(big["tokens"]),
                "--fit",
                str(path),
            ]
        )
        == 0
    )
    # A rung's own endpoint, asked for by its checkpoint: its figure beside the prediction, and no
    # note of another shape (it is of the family).
    capsys.readouterr()
    member = next(
        f.parent
        for f in sorted((tmp_path / "rung-3").rglob("state.json"))
        if json.loads(f.read_text())["progress"]["tokens"] == big["tokens"] and f.parent.name == "final"
    )
    assert main(["ladder", "predict", "--checkpoint", str(member), "--fit", str(path)]) == 0
    said = capsys.readouterr().out
    assert f"{member} itself: {big['bpb']:.4f} bits/byte" in said and "across shapes" not in said


def shipped() -> tuple[LadderParams, PretrainParams, dict]:
    """The ladder and the stable phase as the default profile (local) reads them, and the default
    run's model (its math dict, at the shipped tokenizer's vocabulary)."""
    params = params_of("local")
    pretrain = from_mapping(PretrainParams, params["pretrain"], "pretrain")
    vocab = params["tokenize"]["vocab_size"]
    model = preset(pretrain.model.preset, vocab, **pretrain.model.overrides).math_dict()
    return from_mapping(LadderParams, params["ladder"], "ladder"), pretrain, model


def test_the_default_run_is_a_member_of_the_committed_ladders_family():
    """The ladder of conf/base: its depth-3 rung is the default run's model (3 blocks of width 256,
    heads of 64, d_ff 688, the recipe's residual scalars) and its cooldown rule the default run's
    280-step anneal after 490, so the law describes the run people make."""
    ladder, pretrain, default = shipped()
    family = ladder.family(recipe_overrides(pretrain, ladder))
    assert family_gaps(family, default, (490, 280)) == []
    assert 490 * pretrain.batch_size * 256 == max(ladder.budgets)  # the largest budget: its stable phase
    # Without the recipe's overrides (a fit made before rungs took them), the scalars are named.
    assert family_gaps({**family, "overrides": {}}, default, (490, 280)) == [
        "layer_scalars True where the family's model of depth 3 has None"
    ]


def test_the_committed_ladder_predicts_the_committed_default_run():
    """ladder.json (`make ladder`) against the default run's reports (`make run`), both committed:
    the law's bits per byte for the default run's size and tokens within 2% of what its anneal
    reached, inside the interval, measured as the rungs' endpoints are (the anneal's last held-out
    eval, anneal_metrics.json); the run a member of the fit's family; and the law refitted without
    the depth-3 rung's largest endpoint (the default run's recipe) within 2% of it still. A recipe
    change that breaks the prediction fails here until `make ladder` runs again."""
    reports = ROOT / "data/08_reporting"
    fitted = json.loads((reports / "ladder.json").read_text())
    anneal = json.loads((reports / "anneal_metrics.json").read_text())
    stable = json.loads((reports / "stable_metrics.json").read_text())
    actual, tokens = anneal["heldout"]["bpb"], anneal["tokens"]
    predicted = predict(fitted, stable["n_params"], tokens)
    assert abs(predicted["bpb"] / actual - 1) <= 0.02, (predicted, actual)
    assert predicted["bpb_interval"][0] <= actual <= predicted["bpb_interval"][1], (predicted, actual)
    assert not predicted["beyond"]
    *_, model = shipped()
    per_step = stable["tokens"] // stable["step"]
    assert (
        family_gaps(fitted["family"], model, (stable["step"], (tokens - stable["tokens"]) // per_step)) == []
    )
    (own,) = [e for e in fitted["leave_one_out"]["endpoints"] if e["depth"] == 3 and e["tokens"] == tokens]
    assert abs(own["error"]) <= 0.02, own


def test_rungs_of_different_recipes_are_not_fitted_together():
    ladder = from_mapping(LadderParams, MICRO, "ladder")
    rung = {"endpoints": [], "overrides": {}}
    with pytest.raises(ValueError, match="rungs trained with different model overrides"):
        fit_ladder({1: rung, 2: rung, 3: {**rung, "overrides": {"layer_scalars": True}}}, ladder)


def test_a_model_outside_the_ladders_family_is_said_to_be_an_extrapolation():
    """The default run against the ladder's family before 2026-12-04 (width 32 x depth, cooldowns
    of 20%): three blocks of width 256 and a 280-step anneal after 490 are named, each; a rung is not."""
    ladder = from_mapping(
        LadderParams,
        {
            **MICRO,
            "sizes": [2, 3, 4, 5],
            "shape": {"preset": "cpu-demo", "aspect_ratio": 32, "head_dim": 32, "seq_len": 256},
            "decay_ratio": 0.2,
        },
        "ladder",
    )
    family = ladder.family()
    rung = preset("cpu-demo", 4096, **ladder.shape.of(3)).math_dict()
    assert family_gaps(family, rung, (100, 20)) == []
    default = preset("cpu-demo", 4096).math_dict()
    gaps = family_gaps(family, default, (490, 280))
    assert any(g.startswith("d_model 256 where the family's model of depth 3 has 96") for g in gaps), gaps
    assert any(g.startswith("d_ff 688") for g in gaps) and any(g.startswith("n_head 4 ") for g in gaps)
    assert "an anneal of 280 steps after 490 (0.57 of them) where each rung cools down 0.2" in gaps[-1]
    deep = preset("cpu-demo", 4096, **ladder.shape.of(7)).math_dict()
    assert family_gaps(family, deep, (100, 20)) == ["depth 7, outside the rungs' 2 to 5"]
    assert family_gaps(family, rung) == [
        "not annealed (a stable phase's checkpoint), where every rung's endpoint is"
    ]
    assert family_gaps(family, rung, (100, 20), batch_warmup_steps=105) == [
        "a batch-size warmup over its first 105 steps, where no rung has one"
    ]


def test_a_law_fitted_to_its_own_values_comes_back():
    truth = Law(E=1.7, A=400.0, B=410.0, alpha=0.34, beta=0.28)
    n, d = np.meshgrid([1e5, 3e5, 1e6, 3e6], [1e6, 3e6, 1e7])
    # Two starts per parameter (the corners of GRID's box) rather than GRID's 432: the micro ladder
    # test fits with GRID itself.
    corners = {k: v[[0, -1]] for k, v in GRID.items()}
    law = fit(n.ravel(), d.ravel(), truth.loss(n.ravel(), d.ravel()), starts=corners)
    assert law.alpha == pytest.approx(0.34, rel=0.05) and law.beta == pytest.approx(0.28, rel=0.05)
    assert law.E == pytest.approx(1.7, rel=0.02)  # noqa: SIM300 (law.E is the fitted floor, not a constant)
    with pytest.raises(FitError, match="5 endpoints .* needs at least 6"):
        fit(n.ravel()[:5], d.ravel()[:5], truth.loss(n.ravel()[:5], d.ravel()[:5]))


def test_bad_ladders_are_refused_naming_the_key(recipe, smoke_shards):
    with pytest.raises(ValueError, match="ladder.shape.head_dim = 24 does not divide the width of depth 1"):
        from_mapping(LadderParams, {**MICRO, "shape": {**MICRO["shape"], "head_dim": 24}}, "ladder")
    pretrain, anneal = recipe
    shards = ShardsDataset(str(smoke_shards)).load()
    huge = from_mapping(LadderParams, {**MICRO, "budgets": [512 * 10_000]}, "ladder")
    with pytest.raises(ValueError, match="more than the corpus's .* repeated pretrain.max_epochs_warn"):
        rung_params(pretrain, anneal, huge, 1, shards)
    # A recipe's batch-size warmup stays off the rungs, whose budgets are whole steps.
    warmup = dataclasses.replace(pretrain, batch_warmup_steps=10, batch_warmup_start=4)
    stable, _ = rung_params(warmup, anneal, from_mapping(LadderParams, MICRO, "ladder"), 1, shards)
    assert stable.batch_warmup_steps == 0 and stable.branch_points == [5120]
    off = from_mapping(LadderParams, {**MICRO, "budgets": [5000]}, "ladder")
    with pytest.raises(ValueError, match="ladder.budgets = 5000 is not a whole number of steps of 512"):
        rung_params(pretrain, anneal, off, 1, shards)
    assert main(["ladder", "predict", "--params", "1e6", "--tokens", "1e7", "--fit", "nowhere.json"]) == 2
