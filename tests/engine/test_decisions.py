"""The loop's decisions, alone: when the held-out curve counts as stalled (auto-anneal), and which
data mix a step of a staged anneal draws from, at the phase boundaries."""

from __future__ import annotations

from lehr.engine.evaluation import stalled
from lehr.engine.loop import anneal_mix


def test_a_curve_stalls_when_its_latest_half_no_longer_beats_the_half_before():
    assert not stalled([5.0, 4.9, 4.8], window=4, eps=0.01)  # too few evals to judge
    assert not stalled([5.0, 4.8, 4.6, 4.4], window=4, eps=0.01)  # still falling
    assert stalled([5.0, 4.4, 4.41, 4.40], window=4, eps=0.01)  # flat
    assert stalled([5.0, 4.4, 4.395, 4.5], window=4, eps=0.01)  # a gain below eps
    assert not stalled([5.0, 4.4, 4.38, 4.5], window=4, eps=0.01)  # a gain above eps
    assert stalled([3.0, 3.0, 4.0, 4.0, 4.0, 4.0], window=4, eps=0.01)  # only the last window counts


def test_a_staged_anneal_switches_mix_exactly_at_its_phase_boundaries(tiny_config):
    silver, gold = {"silver": 1.0}, {"gold": 1.0}
    cfg = tiny_config(stable_mix={"gold": 1.0, "silver": 1.0}, anneal_mix=[[0.5, silver], [1.0, gold]],
                      anneal_steps=10)
    assert anneal_mix(cfg, 99, anneal_start=100) == cfg.stable_mix  # before the anneal
    assert anneal_mix(cfg, 50, anneal_start=None) == cfg.stable_mix  # no anneal decided yet
    assert [anneal_mix(cfg, s, anneal_start=100) for s in (100, 104)] == [silver, silver]
    assert [anneal_mix(cfg, s, anneal_start=100) for s in (105, 109, 110, 200)] == [gold] * 4
