"""Learning-rate schedules, stateless: the LR is a pure function of the step.

* ``wsd`` (warmup-stable-decay): linear warmup to the peak, flat until ``anneal_start``, then a
  decay of ``anneal_steps`` to ``min_lr`` with shape ``linear``, ``cosine`` or ``1-sqrt``. With
  ``anneal_start=None`` the stable phase is open-ended (the decay start is decided later).
* ``cosine``: linear warmup, then cosine from the peak to ``min_lr`` at ``planned_steps``.
"""

from __future__ import annotations

import math

SHAPES = ("linear", "cosine", "1-sqrt")


def decay_factor(progress: float, shape: str) -> float:
    """1 at the start of the decay, 0 at its end; ``progress`` in [0, 1]."""
    p = min(max(progress, 0.0), 1.0)
    if shape == "linear":
        return 1.0 - p
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(p)
    raise ValueError(f"unknown decay shape {shape!r}; choose one of {', '.join(SHAPES)}")


def lr_at(
    step: int,
    *,
    schedule: str,
    lr: float,
    min_lr: float,
    warmup_steps: int,
    planned_steps: int,
    anneal_start: int | None,
    anneal_steps: int,
    decay_shape: str,
) -> float:
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "cosine":
        progress = (step - warmup_steps) / max(1, planned_steps - warmup_steps)
        return min_lr + (lr - min_lr) * decay_factor(progress, "cosine")
    if schedule != "wsd":
        raise ValueError(f"unknown schedule {schedule!r}; choose wsd or cosine")
    if anneal_start is None or step < anneal_start:
        return lr
    progress = (step - anneal_start + 1) / max(1, anneal_steps)
    return min_lr + (lr - min_lr) * decay_factor(progress, decay_shape)


def mix_at(
    step: int, anneal_start: int | None, anneal_steps: int, stable_mix: dict[str, float], anneal_mix: list
) -> dict[str, float]:
    """The data mix of a step: ``stable_mix`` until the anneal starts, then the phase of
    ``anneal_mix`` (``[[end_fraction, {tier: weight}], ...]``) the step's place in the decay falls in."""
    if anneal_start is None or step < anneal_start or not anneal_mix:
        return stable_mix
    frac = (step - anneal_start) / max(1, anneal_steps)
    for end_fraction, weights in anneal_mix:
        if frac < end_fraction:
            return weights
    return anneal_mix[-1][1]
