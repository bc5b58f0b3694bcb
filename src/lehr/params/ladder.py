"""The model ladder's params (``conf/base/parameters_ladder.yml``): the sizes, the rule that gives
each its shape, the budgets and the fit's settings. Apart from ``lehr.training.ladder_rungs``
(which trains the rungs), so that the fit's stage reads them without depending on the training
code."""

from __future__ import annotations

import dataclasses
import math
import typing

from lehr.config_parts import Part, Section, require, require_positive


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShapeRule(Part):
    """One knob per rung, its depth; the rest of the shape follows: width = aspect_ratio x (depth +
    depth_offset), heads of head_dim each, SwiGLU's d_ff = 8/3 x width rounded up to a multiple of
    16, and one context length for every rung (the preset, and the recipe's model overrides, give
    everything else, e.g. QK-norm). The offset lets a family hold a shape that no multiple of its
    depth gives: the default run's 3 blocks of width 256 are 64 x (3 + 1)."""

    preset: str
    aspect_ratio: int
    head_dim: int
    seq_len: int
    depth_offset: int = 0

    def check(self) -> None:
        require_positive(self, "aspect_ratio", "head_dim", "seq_len")
        require(self.head_dim % 2 == 0, "head_dim", self.head_dim, "must be even (RoPE rotates pairs)")
        require(self.depth_offset >= 0, "depth_offset", self.depth_offset, "must be >= 0")

    def width_rule(self) -> str:
        if self.depth_offset:
            return f"{self.aspect_ratio} x (depth + {self.depth_offset})"
        return f"{self.aspect_ratio} x depth"

    def of(self, depth: int) -> dict:
        width = self.aspect_ratio * (depth + self.depth_offset)
        require(
            width % self.head_dim == 0,
            "ladder.shape.head_dim",
            self.head_dim,
            f"does not divide the width of depth {depth} ({self.width_rule()} = {width}): choose a "
            "head_dim that divides aspect_ratio, or an aspect_ratio it divides",
        )
        d_ff = 16 * math.ceil(8 * width / 3 / 16)
        return dict(
            n_layer=depth, d_model=width, n_head=width // self.head_dim, d_ff=d_ff, seq_len=self.seq_len
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class LadderParams(Section):
    sizes: list[int]  # each rung's depth; DVC makes one stage per size
    rung: int  # the size `kedro run --pipelines ladder_rung` trains (its DVC stage sets it); 0 = none
    shape: ShapeRule
    budgets: list[int]  # token counts of every rung's branch points, each cooled down from
    decay_ratio: float  # each cooldown's length, of the steps before its branch point
    flop_budgets: list[float]  # compute budgets (FLOPs) to report N*, D* and tokens per parameter at
    bootstrap: int  # refits to resampled endpoints, for the intervals
    SECTION: typing.ClassVar[str] = "ladder"

    def check(self) -> None:
        require(
            bool(self.sizes) and all(isinstance(s, int) and s > 0 for s in self.sizes),
            "sizes",
            self.sizes,
            "must be a list of positive depths, e.g. [2, 3, 4, 5]",
        )
        require(
            len(self.budgets) >= 1 and all(isinstance(b, int) and b > 0 for b in self.budgets),
            "budgets",
            self.budgets,
            "must be a list of positive token counts",
        )
        require(
            0 < self.decay_ratio <= 1, "decay_ratio", self.decay_ratio, "must lie in (0, 1] (0.2 is usual)"
        )
        require(self.bootstrap >= 0, "bootstrap", self.bootstrap, "must be >= 0 (0 = no intervals)")
        for depth in self.sizes:
            self.shape.of(depth)  # every rung's shape is checked before any trains

    def family(self, overrides: dict | None = None) -> dict:
        """What the rungs have in common, as the fit records it: a model and an anneal outside it
        are an extrapolation of the law (``family_gaps``). ``overrides``: the recipe's model
        overrides beyond the shape, which every rung trained with (each rung's JSON records them)."""
        return {
            "shape": dataclasses.asdict(self.shape),
            "overrides": dict(overrides or {}),
            "depths": sorted(self.sizes),
            "decay_ratio": self.decay_ratio,
        }
