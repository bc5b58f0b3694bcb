"""The recipe's ledger (issue 34; lehr.reports.ledger and bench/ablation.py): the noise floor of
the default's seeds, each ingredient's paired effect over the seeds it shares with the default,
its verdict against the floor, and the experiments the benchmark queues, each accepted by
`lehr exp`'s check of its -S values."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
import yaml

from lehr.project.experiments import check_sets
from lehr.reports.comparison import Scored
from lehr.reports.ledger import check_seeds, effect, noise_floor, seed_settings, verdict
from tests import ROOT

WINDOWS, BYTES = 400, 250.0  # windows per source, bytes each stands for


def scored(seed: int, shift: float = 0.0, items: str = "same", changed: bool = False) -> Scored:
    """Two sources whose windows share a difficulty (the same items in every run), plus a seed's own
    noise, plus (``changed``: an ingredient trains another trajectory from the same seed) a little
    noise of its own; ``shift`` nats are added to every window."""
    difficulty = np.random.default_rng(123).uniform(300, 500, size=(2, WINDOWS))
    noise = np.random.default_rng(seed).normal(0, 4, size=(2, WINDOWS))
    own = np.random.default_rng(1000 + seed).normal(0, 1, size=(2, WINDOWS)) if changed else 0.0
    nats = difficulty + noise + own + shift
    return Scored(
        {"heldout/a": nats[0], "heldout/b": nats[1]}, {}, {"heldout/a": BYTES, "heldout/b": BYTES}, items
    )


def bpb(s: Scored) -> float:
    return float(sum(v.sum() for v in s.nats.values()) / np.log(2) / (2 * WINDOWS * BYTES))


def test_seed_zero_is_the_shipped_default_and_each_seed_draws_its_own_data():
    conf = ROOT / "conf/base"
    pretrain = yaml.safe_load((conf / "parameters_pretrain_stable.yml").read_text())["pretrain"]
    anneal = yaml.safe_load((conf / "parameters_anneal.yml").read_text())["anneal"]
    assert seed_settings(0) == {
        "pretrain.seed": pretrain["seed"],
        "pretrain.data_seed": pretrain["data_seed"],
        "anneal.data_seed": anneal["data_seed"],
    }
    data_seeds = [v for s in range(4) for k, v in seed_settings(s).items() if "data_seed" in k]
    assert len(set(data_seeds)) == len(data_seeds)


@pytest.mark.parametrize(
    "seeds, said",
    [([0, 1, 0], "--seeds 0 1 0 repeats seed 0"), ([2, 2, 3, 3], "repeats seed 2, 3"), ([-1], "seeds >= 0")],
)
def test_a_seed_list_that_repeats_a_seed_is_refused(seeds, said):
    with pytest.raises(ValueError, match=said):
        check_seeds(seeds)


def test_an_effect_is_a_finding_only_beyond_the_noise_floor():
    defaults = {s: scored(s) for s in (0, 1, 2)}
    floor = noise_floor(defaults, {s: bpb(d) for s, d in defaults.items()})
    assert set(floor.pairs) == {(0, 1), (0, 2), (1, 2)} and floor.spread > 0
    assert floor.floor == max(abs(p["diff"]) for p in floor.pairs.values()) > 0
    # 0.08 nats a window lower (~0.0005 bits per byte): paired, the interval sees it; yet two seeds
    # of the default differ by more, so it is no finding.
    small = effect(defaults, {s: scored(s, -0.08, changed=True) for s in (0, 1)})
    assert small["seeds"] == [0, 1] and small["significant"] and small["hi"] < 0
    assert abs(small["diff"]) < floor.floor and verdict(small, floor.floor) == "below the noise floor"
    # Ten nats lower: a finding, of the size it was made.
    large = effect(defaults, {s: scored(s, -10.0, changed=True) for s in (0, 1)})
    assert verdict(large, floor.floor) == "better"
    assert large["diff"] == pytest.approx(-10.0 / np.log(2) / BYTES, rel=0.01)
    worse = effect(defaults, {s: scored(s, +10.0, changed=True) for s in (0, 1)})
    assert verdict(worse, floor.floor) == "worse"
    # Each treated run against its own seed's default: pure noise of another seed is no effect.
    other_seed = effect({0: defaults[0]}, {0: scored(7)})
    same_seed = effect({0: defaults[0]}, {0: scored(0)})
    assert same_seed["diff"] == 0 and abs(other_seed["diff"]) > 0
    assert (
        verdict(effect(defaults, {s: scored(s) for s in (0, 1)}), floor.floor) == "no significant difference"
    )


def test_runs_scored_on_other_items_or_without_a_shared_seed_are_refused():
    defaults = {0: scored(0), 1: scored(1)}
    with pytest.raises(ValueError, match="different held-out windows"):
        effect(defaults, {0: scored(0, items="other")})
    with pytest.raises(ValueError, match="no seed has both"):
        effect(defaults, {5: scored(5)})
    with pytest.raises(ValueError, match="two seeds or more"):
        noise_floor({0: defaults[0]}, {0: 1.0})


def ablation():
    spec = importlib.util.spec_from_file_location("ablation", ROOT / "bench/ablation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_ledger_experiment_is_accepted_as_the_stages_would_take_it(tmp_path):
    """What `python bench/ablation.py ledger` and `combine` would queue: each ingredient alone and
    all of them together, at a seed, pass the check `lehr exp` runs before queueing anything."""
    bench = ablation()
    everything = "+".join(bench.INGREDIENTS)
    runs = bench.ledger_runs([*bench.INGREDIENTS, everything], [1])
    assert set(runs) == {f"l-{name}-s1" for name in [*bench.INGREDIENTS, everything]}
    for name, settings in runs.items():
        assert check_sets(ROOT, "base", bench.set_args(settings)[1::2]) == [], name


def test_the_benchmark_refuses_a_repeated_seed_before_queueing_anything():
    out = subprocess.run(
        [sys.executable, "bench/ablation.py", "noise", "--seeds", "0", "1", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "--seeds 0 1 1 repeats seed 1" in out.stderr and out.stdout == ""


def test_an_ingredient_already_in_the_default_is_refused_by_name_and_left_out_of_the_whole_ledger():
    """Its run would be the default's own: named, it is refused before anything is queued; the
    whole ledger leaves it out (the default's rows have it)."""
    bench = ablation()
    adopted = [n for n in bench.INGREDIENTS if bench.in_default(bench.INGREDIENTS[n][2], ROOT)]
    assert adopted == ["layer-scalars", "evals-half"]  # conf/base's model.overrides; its eval intervals
    named = subprocess.run(
        [
            sys.executable,
            "bench/ablation.py",
            "ledger",
            "layer-scalars",
            "relu2",
            "--seeds",
            "0",
            "--dry-run",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert named.returncode != 0 and "layer-scalars: already in this commit's default" in named.stderr
    assert named.stdout == ""
    whole = subprocess.run(
        [sys.executable, "bench/ablation.py", "ledger", "--seeds", "0", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert whole.returncode == 0, whole.stderr
    assert "l-relu2-s0:" in whole.stdout and "layer-scalars" not in whole.stdout
