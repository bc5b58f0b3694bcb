"""The plan over the steps, stateless (each a pure function of the step): the learning rate
(``LrSchedule``), a cooldown's length (``cooldown_steps``), the batch-size warmup (``BatchRamp``)
and the data mix (``mix_at``). The learning rate's schedules:

* ``wsd`` (warmup-stable-decay): linear warmup to the peak, flat until ``anneal_start``, then a
  decay of ``anneal_steps`` to ``min_lr`` with shape ``linear``, ``cosine`` or ``1-sqrt``. With
  ``anneal_start=None`` the stable phase is open-ended (the decay start is decided later).
* ``cosine``: linear warmup, then cosine from the peak to ``min_lr`` at ``planned_steps``.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

DecayShape = Literal["linear", "cosine", "1-sqrt"]
SHAPES: tuple[DecayShape, ...] = typing.get_args(DecayShape)
# One phase of an anneal mix, (end_fraction, {tier: weight}); from YAML a two-item list, read alike.
Phase = tuple[float, dict[str, float]]


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


@dataclass(frozen=True, kw_only=True)
class LrSchedule:
    """The learning rate of every step of one plan."""

    kind: str  # wsd or cosine
    lr: float  # the peak
    min_lr: float  # where the decay (or the cosine) ends
    warmup_steps: int
    planned_steps: int  # the cosine's end
    anneal_start: int | None  # WSD's first step of the decay; None while it is undecided
    anneal_steps: int
    decay_shape: str

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.kind == "cosine":
            progress = (step - self.warmup_steps) / max(1, self.planned_steps - self.warmup_steps)
            return self.min_lr + (self.lr - self.min_lr) * decay_factor(progress, "cosine")
        if self.kind != "wsd":
            raise ValueError(f"unknown schedule {self.kind!r}; choose wsd or cosine")
        if self.anneal_start is None or step < self.anneal_start:
            return self.lr
        progress = (step - self.anneal_start + 1) / max(1, self.anneal_steps)
        return self.min_lr + (self.lr - self.min_lr) * decay_factor(progress, self.decay_shape)


def cooldown_steps(ratio: float, steps: int) -> int:
    """A decay of ``ratio`` of ``steps`` (the steps trained before it, or the planned ones), at
    least one step: Hägele et al.'s cooldown of 20% is ``cooldown_steps(0.2, start)``."""
    return max(1, round(ratio * steps))


@dataclass(frozen=True)
class BatchRamp:
    """A batch-size warmup: ``start`` sequences a step, then 2x, 3x ... that, in stages as equal
    as whole steps allow, below ``batch_size`` for the first ``warmup_steps`` (0 = none), then
    ``batch_size``. The same steps then train fewer tokens (``rows_before``)."""

    batch_size: int
    warmup_steps: int
    start: int

    def rows(self, step: int) -> int:
        """The sequences ``step`` draws: batch_size, or a stage of the warmup."""
        if step >= self.warmup_steps:
            return self.batch_size
        stages = self.batch_size // self.start  # the last is batch_size itself
        return self.start * (1 + step * (stages - 1) // self.warmup_steps)

    def rows_before(self, step: int) -> int:
        """The sequences the steps before ``step`` drew (times seq_len: the tokens trained)."""
        ramp = sum(self.rows(s) for s in range(min(step, self.warmup_steps)))
        return ramp + max(0, step - self.warmup_steps) * self.batch_size

    def steps_in(self, rows: int) -> int:
        """The most steps whose sequences add up to at most ``rows`` (>= 0)."""
        ramp = self.rows_before(self.warmup_steps)
        if rows >= ramp:
            return self.warmup_steps + (rows - ramp) // self.batch_size
        return next(s for s in range(self.warmup_steps) if self.rows_before(s + 1) > rows)


def mix_at(
    step: int,
    anneal_start: int | None,
    anneal_steps: int,
    stable_mix: dict[str, float],
    anneal_mix: Sequence[Phase],
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
