"""LR schedules: warmup, open-ended stable phase, decay shapes, cosine baseline."""

import math

import pytest

from lehr.engine.schedule import decay_factor, lr_at

WSD = dict(
    schedule="wsd",
    lr=1.0,
    min_lr=0.1,
    warmup_steps=10,
    planned_steps=100,
    anneal_steps=20,
    decay_shape="linear",
)


def test_warmup_is_linear_to_peak():
    assert [lr_at(s, anneal_start=None, **WSD) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])


def test_stable_phase_is_open_ended_until_a_start_is_decided():
    assert all(lr_at(s, anneal_start=None, **WSD) == 1.0 for s in range(10, 10_000, 97))


@pytest.mark.parametrize("shape, mid", [("linear", 0.5), ("cosine", 0.5), ("1-sqrt", 1 - math.sqrt(0.5))])
def test_decay_shapes(shape, mid):
    assert decay_factor(0.0, shape) == 1.0 and decay_factor(1.0, shape) == pytest.approx(0.0)
    assert decay_factor(0.5, shape) == pytest.approx(mid)


def test_wsd_decays_from_the_decided_start_to_min_lr():
    cfg = {**WSD, "decay_shape": "1-sqrt"}
    assert lr_at(59, anneal_start=60, **cfg) == 1.0
    lrs = [lr_at(s, anneal_start=60, **cfg) for s in range(60, 80)]
    assert all(a > b for a, b in zip(lrs, lrs[1:], strict=False))
    assert lrs[-1] == pytest.approx(0.1)


def test_cosine_baseline_ends_at_min_lr_at_planned_steps():
    cfg = {**WSD, "schedule": "cosine"}
    assert lr_at(10, anneal_start=None, **cfg) == pytest.approx(1.0)
    assert lr_at(55, anneal_start=None, **cfg) == pytest.approx(0.55)
    assert lr_at(100, anneal_start=None, **cfg) == pytest.approx(0.1)


def test_unknown_shape_is_an_error():
    with pytest.raises(ValueError, match="unknown decay shape 'sqrt'"):
        decay_factor(0.5, "sqrt")
