"""When a run stops, or its stable phase ends: small policies the loop asks at fixed points.

Each policy sees the run's ``Progress`` at the start, after a step or after an eval and either changes the
anneal start (the stable phase ends there) or names a reason to stop. The eval history is the
same on every rank (rank 0 broadcasts it), so every rank decides the same without more syncs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from lehr.engine.config import StopRule, TrainConfig, task_metric
from lehr.errors import Explained

log = logging.getLogger("lehr.train")


class DivergedError(RuntimeError, Explained):
    """Too many non-finite steps in a row; the last good checkpoint was left untouched."""


@dataclass
class Progress:
    """Everything besides tensors that a resumed run must restore; saved in state.json."""

    step: int = 0
    tokens: int = 0
    anneal_start: int | None = None  # stable phase: the decided start of the decay
    anneal_reason: str | None = None
    # [{"step": 40, "heldout": {"loss": ...}, <source>: {...}}]
    evals: list[dict[str, Any]] = field(default_factory=list)
    best_loss: float | None = None
    skips_total: int = 0  # updates skipped for a non-finite grad norm
    spikes_total: int = 0  # updates skipped as loss spikes
    # the spike guard's recent losses (guard.StepGuard)
    loss_window: dict[str, Any] = field(default_factory=dict)
    world_sizes: list[list[int]] = field(default_factory=list)  # [[from step, processes], ...] in its life
    # [{from_step, code_sha256, versions}, ...]: which code (``code_identity``) and versions trained
    # each step range, a branch's starting with those of the checkpoint it grew from
    trained_by: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None  # why the run ended (early stop, ...); None while it runs or at its end
    # [{step, changed: {setting: [old, new]}}, ...]: the plan a resume changed, and where (``run.plan``)
    plan_changes: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_state(cls, saved: dict[str, Any]) -> Progress:
        """From a checkpoint's state. Checkpoints before 2026-11-30 kept each eval flat
        (``"heldout.loss"``); they resume with it nested, as evals are kept now."""
        evals = [
            {k: v for k, v in e.items() if "." not in k} | _nest({k: v for k, v in e.items() if "." in k})
            for e in saved.get("evals", [])
        ]
        return cls(**{**saved, "evals": evals})

    def scores(self, metric: str) -> list[float]:
        return [score(e, metric) for e in self.evals]

    def best_at(self, metric: str, since: int = 0) -> int | None:
        """The index in ``evals`` of the first eval from step ``since`` with the best score."""
        steps = [i for i, e in enumerate(self.evals) if e["step"] >= since]
        return min(steps, key=lambda i: score(self.evals[i], metric)) if steps else None


def score(ev: dict[str, Any], metric: str) -> float:
    """``metric`` of one eval (``heldout.loss``, ``tasks.<task>.acc``…), signed so that lower is
    better: a task's accuracy or log-likelihood counts negated."""
    if parsed := task_metric(metric):
        task, name = parsed
        negated: float = -ev["tasks"][task][name]
        return negated
    source, name = metric.rsplit(".", 1)
    value: float = ev[source][name]
    return value


def _nest(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        source, metric = key.rsplit(".", 1)  # a source name may hold dots; a metric name does not
        out.setdefault(source, {})[metric] = value
    return out


def stalled(losses: list[float], window: int, eps: float) -> bool:
    """True when the best of the latest ``window/2`` evals beats the best of the half before by < eps.

    The held-out windows are fixed, so the curve is smooth enough for a small eps.
    """
    if len(losses) < window:
        return False
    half = window // 2
    return min(losses[-half:]) > min(losses[-window:-half]) - eps


class Policy:
    def at_start(self, prog: Progress) -> None:
        return None

    def after_step(self, prog: Progress) -> str | None:
        return None

    def after_eval(self, prog: Progress) -> str | None:
        return None


@dataclass
class PlannedAnneal(Policy):
    """Without auto-anneal, the stable phase ends where the budget planned it."""

    rule: StopRule

    def at_start(self, prog: Progress) -> None:
        if prog.anneal_start is None:
            prog.anneal_start, prog.anneal_reason = self.rule.planned_step, "planned"


@dataclass
class AutoAnneal(Policy):
    """End the stable phase once the eval curve (``decide_by``) stalls, but never before ``min_step``."""

    rule: StopRule
    metric: str = "heldout.loss"

    def after_eval(self, prog: Progress) -> None:
        r = self.rule
        if (
            prog.anneal_start is None
            and prog.step >= r.min_step
            and stalled(prog.scores(self.metric), r.stall_window, r.stall_eps)
        ):
            prog.anneal_start, prog.anneal_reason = prog.step, "stall"
            log.info(
                "auto-anneal: %s stalled; the anneal starts at step %d (planned %d, bounds %d..%d)",
                self.metric,
                prog.step,
                r.planned_step,
                r.min_step,
                r.max_step,
            )


@dataclass
class AnnealCap(Policy):
    """...and at ``max_step`` at the latest, stalled or not."""

    rule: StopRule

    def after_step(self, prog: Progress) -> None:
        if prog.anneal_start is None and prog.step >= self.rule.max_step:
            prog.anneal_start, prog.anneal_reason = self.rule.max_step, "cap"


@dataclass
class EarlyStop(Policy):
    """Stop when ``patience`` evals since ``from_step`` brought no new best (anneal branches)."""

    patience: int
    from_step: int
    metric: str = "heldout.loss"

    def after_eval(self, prog: Progress) -> str | None:
        if prog.step < self.from_step:
            return None
        best_at = prog.best_at(self.metric, self.from_step)
        assert best_at is not None  # this eval's own step is at least from_step
        if len(prog.evals) - 1 - best_at < self.patience:
            return None
        log.info(
            "early stop: no improvement of %s in %d evals; best at step %d",
            self.metric,
            self.patience,
            prog.evals[best_at]["step"],
        )
        return "early_stop"


@dataclass
class Divergence:
    """Abort after ``limit`` non-finite steps in a row (read at sync points, where the host reads
    the guard's counts anyway). fp16 overflows are routine: the scaler lowers its scale instead."""

    limit: int
    precision: str

    def check(self, longest: int, step: int, checkpoints: str) -> None:
        if longest >= self.limit and self.precision != "fp16":
            raise DivergedError(
                f"{longest} consecutive non-finite steps (by step {step}): the run diverged. "
                f"The last good checkpoint in {checkpoints} is untouched; resume with a lower lr."
            )


def policies(cfg: TrainConfig) -> list[Policy]:
    """The stop policies a run's config asks for, in the order the loop consults them."""
    rule = cfg.stop_rule
    out: list[Policy] = []
    if rule is not None:
        out += [AutoAnneal(rule, cfg.decide_by), AnnealCap(rule)] if rule.auto else [PlannedAnneal(rule)]
    if cfg.patience:
        out.append(EarlyStop(cfg.patience, cfg.patience_from_step, cfg.decide_by))
    return out
