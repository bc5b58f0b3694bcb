"""The loop's decisions, alone: when the held-out curve counts as stalled (auto-anneal), and which
data mix a step of a staged anneal draws from, at the phase boundaries."""

from __future__ import annotations

from lehr.engine.schedule import mix_at
from lehr.engine.stopping import stalled


def test_a_curve_stalls_when_its_latest_half_no_longer_beats_the_half_before():
    assert not stalled([5.0, 4.9, 4.8], window=4, eps=0.01)  # too few evals to judge
    assert not stalled([5.0, 4.8, 4.6, 4.4], window=4, eps=0.01)  # still falling
    assert stalled([5.0, 4.4, 4.41, 4.40], window=4, eps=0.01)  # flat
    assert stalled([5.0, 4.4, 4.395, 4.5], window=4, eps=0.01)  # a gain below eps
    assert not stalled([5.0, 4.4, 4.38, 4.5], window=4, eps=0.01)  # a gain above eps
    assert stalled([3.0, 3.0, 4.0, 4.0, 4.0, 4.0], window=4, eps=0.01)  # only the last window counts


def test_a_staged_anneal_switches_mix_exactly_at_its_phase_boundaries():
    silver, gold = {"silver": 1.0}, {"gold": 1.0}
    stable, phases = {"gold": 1.0, "silver": 1.0}, [[0.5, silver], [1.0, gold]]

    def mix(step, anneal_start=100):
        return mix_at(step, anneal_start, 10, stable, phases)

    assert mix(99) == stable  # before the anneal
    assert mix(50, anneal_start=None) == stable  # no anneal decided yet
    assert [mix(s) for s in (100, 104)] == [silver, silver]
    assert [mix(s) for s in (105, 109, 110, 200)] == [gold] * 4
