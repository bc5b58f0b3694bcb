"""LR schedules: warmup, open-ended stable phase, decay shapes, cosine baseline."""

import math

import pytest

from lehr.engine.schedule import LrSchedule, cooldown_steps, decay_factor

WSD = dict(
    kind="wsd",
    lr=1.0,
    min_lr=0.1,
    warmup_steps=10,
    planned_steps=100,
    anneal_steps=20,
    decay_shape="linear",
)


def test_warmup_is_linear_to_peak():
    assert [LrSchedule(anneal_start=None, **WSD).lr_at(s) for s in (0, 4, 9)] == pytest.approx(
        [0.1, 0.5, 1.0]
    )


def test_stable_phase_is_open_ended_until_a_start_is_decided():
    assert all(LrSchedule(anneal_start=None, **WSD).lr_at(s) == 1.0 for s in range(10, 10_000, 97))


@pytest.mark.parametrize("shape, mid", [("linear", 0.5), ("cosine", 0.5), ("1-sqrt", 1 - math.sqrt(0.5))])
def test_decay_shapes(shape, mid):
    assert decay_factor(0.0, shape) == 1.0 and decay_factor(1.0, shape) == pytest.approx(0.0)
    assert decay_factor(0.5, shape) == pytest.approx(mid)


def test_wsd_decays_from_the_decided_start_to_min_lr():
    cfg = {**WSD, "decay_shape": "1-sqrt"}
    assert LrSchedule(anneal_start=60, **cfg).lr_at(59) == 1.0
    lrs = [LrSchedule(anneal_start=60, **cfg).lr_at(s) for s in range(60, 80)]
    assert all(a > b for a, b in zip(lrs, lrs[1:], strict=False))
    assert lrs[-1] == pytest.approx(0.1)


def test_cosine_baseline_ends_at_min_lr_at_planned_steps():
    cfg = {**WSD, "kind": "cosine"}
    assert LrSchedule(anneal_start=None, **cfg).lr_at(10) == pytest.approx(1.0)
    assert LrSchedule(anneal_start=None, **cfg).lr_at(55) == pytest.approx(0.55)
    assert LrSchedule(anneal_start=None, **cfg).lr_at(100) == pytest.approx(0.1)


def test_unknown_shape_is_an_error():
    with pytest.raises(ValueError, match="unknown decay shape 'sqrt'"):
        decay_factor(0.5, "sqrt")


def test_a_cooldown_is_its_ratio_of_the_steps_at_least_one():
    assert cooldown_steps(0.2, 490) == 98 and cooldown_steps(0.2, 2) == 1 and cooldown_steps(0.0, 100) == 1
