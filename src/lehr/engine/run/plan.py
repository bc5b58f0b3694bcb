"""A resumed run's plan: the settings that may change on resume (``setting(resumable=True)``: no
step computes differently under them) but that decide where the run ends, a step's learning rate
(the cosine's shape follows ``planned_steps``), or which evals those decisions read.

A run resumed under another plan goes on only where its history is what the new plan would have
made: every step already trained has the new plan's learning rate and data mix, and the new plan,
replayed over the evals the run recorded, ends the run no earlier than the steps trained (and,
where the run has ended, at the very step it ended at). Then it trains to the new plan's end, one
line says so, and ``progress.plan_changes`` records the step and what changed. Otherwise the
resume is refused before any work, naming the run folder, each setting old → new, and the fixes:
a pinned run never says "nothing trained" under a plan it was not trained under.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lehr.config_parts import renames
from lehr.engine.artifacts.checkpoint import CheckpointError
from lehr.engine.config import StopRule, TrainConfig
from lehr.engine.run.stopping import Progress, score, stalled
from lehr.engine.schedule import LrSchedule, mix_at

log = logging.getLogger("lehr.train")
Changes = dict[str, tuple[Any, Any]]  # setting -> (old, new)

# Where the run ends and the learning rate of each step (with the stop rule's fields, but where
# it saves and the branch points it keeps: ``Run._check_branch_points`` answers for those).
PLAN = ("planned_steps", "end_step", "patience", "patience_from_step", "decide_by")
RULE_PLACES = ("save_to", "keep", "keep_to")
# What the evals are: they matter where a decision reads them (auto-anneal, an early stop).
EVALS = ("eval_every", "eval_windows", "task_examples", "task_files")


def plan_of(config: dict[str, Any]) -> dict[str, Any]:
    """The plan's settings of a config (``TrainConfig.to_dict``, or a checkpoint's record of it),
    flat: the stop rule's as ``stop_rule.<field>``. A key an older record lacks is at its default,
    under which that record's run trained; a renamed one is read under its old name."""
    config = dict(config)
    for old, new in renames(TrainConfig).items():
        if new not in config and old in config:
            config[new] = config[old]
    defaults = {
        f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(TrainConfig)
    }
    flat = {k: config.get(k, defaults[k]) for k in (*PLAN, *EVALS)}
    rule = config.get("stop_rule")
    flat.update({f"stop_rule.{k}": v for k, v in (rule or {}).items() if k not in RULE_PLACES})
    return flat


def _changed(old: dict[str, Any], new: dict[str, Any], keys: Iterable[str]) -> Changes:
    return {k: (old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)}


def _said(changes: Changes) -> str:
    return ", ".join(f"{k} {_value(a)} → {_value(b)}" for k, (a, b) in changes.items())


def _value(v: object) -> str:
    return "none" if v is None else str(v)


def anneal_decision(
    rule: StopRule | None, metric: str, eval_every: int, prog: Progress
) -> tuple[int, str] | None:
    """Where ``rule`` starts the anneal for a run whose history is ``prog``: the planned step, or
    (auto-anneal) the first eval that stalls from ``min_step``, or the cap, replayed over the evals
    recorded up to ``prog.step`` as the loop takes them (``stopping.AutoAnneal``, ``AnnealCap``);
    None while undecided there."""
    if rule is None:
        return None
    if not rule.auto:
        return rule.planned_step, "planned"
    scores = []
    for ev in prog.evals:
        if ev["step"] > min(prog.step, rule.max_step):
            break
        scores.append(score(ev, metric))
        decides = ev["step"] % eval_every == 0 and ev["step"] >= rule.min_step
        if decides and stalled(scores, rule.stall_window, rule.stall_eps):
            return ev["step"], "stall"
    return (rule.max_step, "cap") if prog.step >= rule.max_step else None


def early_stop_step(
    patience: int, from_step: int, metric: str, eval_every: int, prog: Progress
) -> int | None:
    """The step at which ``stopping.EarlyStop`` would have stopped this history, if it would."""
    if not patience:
        return None
    for i, ev in enumerate(prog.evals):
        if ev["step"] > prog.step:
            break
        if ev["step"] % eval_every or ev["step"] < from_step:
            continue
        best = Progress(evals=prog.evals[: i + 1]).best_at(metric, from_step)
        assert best is not None  # eval i is from from_step on
        if i - best >= patience:
            step: int = ev["step"]
            return step
    return None


def lr_schedule(cfg: TrainConfig, anneal_start: int | None, planned_steps: int | None = None) -> LrSchedule:
    """The learning rates of ``cfg`` (its ``planned_steps``, or another's) with the anneal
    starting at ``anneal_start``: what the loop sets, and what a plan check compares."""
    return LrSchedule(
        kind=cfg.schedule,
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        warmup_steps=cfg.warmup_steps,
        planned_steps=cfg.planned_steps if planned_steps is None else planned_steps,
        anneal_start=anneal_start,
        anneal_steps=cfg.anneal_steps,
        decay_shape=cfg.decay_shape,
    )


def _first_other_step(
    cfg: TrainConfig, old_planned: int, old_start: int | None, new_start: int | None, steps: int
) -> tuple[int, str, object, object] | None:
    """The first step trained whose learning rate or data mix the new plan sets otherwise:
    (step, what, old, new), or None."""

    def mix(s: int, start: int | None) -> dict[str, float]:
        return mix_at(s, start, cfg.anneal_steps, cfg.stable_mix, cfg.anneal_mix)

    old, new = lr_schedule(cfg, old_start, old_planned), lr_schedule(cfg, new_start)
    for s in range(steps):
        a, b = old.lr_at(s), new.lr_at(s)
        if a != b:
            return s, "learning rate", f"{a:.8g}", f"{b:.8g}"
        if mix(s, old_start) != mix(s, new_start):
            return s, "data mix", mix(s, old_start), mix(s, new_start)
    return None


@dataclasses.dataclass
class _Resume:
    """What a resume under a changed plan is: the two plans, the run's history, and the new plan's
    decisions over it."""

    path: Path
    cfg: TrainConfig
    prog: Progress
    old: dict[str, Any]  # the checkpoint's config, as recorded
    changes: Changes  # plan key -> (old, new)
    eval_changes: Changes

    @property
    def stable(self) -> bool:
        return self.cfg.stop_rule is not None

    def ended(self) -> str | None:
        """How the run ended, if it has: an early stop, the stable phase's anneal start, or the last
        step of a run with a tail average (its weights are the average from then on). A run cut
        short by ``end_step`` without one may go on: its weights are its last step's."""
        prog = self.prog
        if prog.stopped:
            return f"it stopped at step {prog.step} under the old plan ({prog.stopped.replace('_', ' ')})"
        if self.stable and prog.anneal_start is not None and prog.step >= prog.anneal_start:
            return (
                f"its stable phase ended at step {prog.step} under the old plan (the anneal start, "
                f"{prog.anneal_reason}; its pre_anneal is of that step)"
            )
        cfg = self.cfg
        decay_end = None if cfg.anneal_start is None else cfg.anneal_start + cfg.anneal_steps
        if not self.stable and cfg.tail_steps and decay_end is not None and prog.step >= decay_end:
            return (
                f"it reached its decay's end at step {prog.step}, where its tail average went into its "
                "weights"
            )
        return None

    def reads_evals(self) -> bool:
        """Whether the old or the new plan decides the run's end by evals it recorded."""
        old_rule, cfg = self.old.get("stop_rule") or {}, self.cfg
        if (old_rule.get("auto") or (cfg.stop_rule and cfg.stop_rule.auto)) and self.prog.evals:
            return True
        if not (self.old.get("patience") or cfg.patience):
            return False
        since = min(self.old.get("patience_from_step", 0), cfg.patience_from_step)
        return any(ev["step"] >= since for ev in self.prog.evals)

    def folder_fix(self) -> str:
        if self.stable:
            keyed = all(k == "planned_steps" or k.startswith("stop_rule.") for k in self.changes)
            return "pretrain.run_name=<a new name>" + (
                ', or pretrain.run_name="" for a folder keyed by the plan' if keyed else ""
            )
        if self.cfg.init_from is not None:
            return "anneal.branch=<a new name>"
        return "another out_dir"

    def refuse(self, changes: Changes, why: str) -> CheckpointError:
        return CheckpointError(
            f"refusing to resume {self.cfg.out_dir} ({self.path.name}) under another plan "
            f"({_said(changes)}): {why}. Set the old value(s) back, train the new plan in a run folder of "
            f"its own ({self.folder_fix()}), or delete {self.cfg.out_dir} to train it afresh."
        )

    def check_what_no_replay_answers(self) -> None:
        """A branch's start and the evals its decisions read: the history holds no answer to what
        the new settings would have made of them."""
        old, cfg = self.old, self.cfg
        if old.get("init_from") is not None and old.get("init_optimizer", True) != cfg.init_optimizer:
            carried = old.get("init_optimizer", True)
            how = "with the optimizer state it carried" if carried else "with fresh optimizer state"
            raise self.refuse(
                {"init_optimizer": (carried, cfg.init_optimizer)},
                f"its steps from {old['init_from']} on were trained {how}",
            )
        if self.eval_changes and self.reads_evals():
            raise self.refuse(
                {**self.changes, **self.eval_changes},
                "its end is decided by evals (auto-anneal or an early stop), and those it recorded were "
                "made under the old eval settings",
            )

    def follow(self) -> str:
        """The new plan, replayed over the history: refused where the history is not its own,
        else ``prog`` set to its decisions; says where the run goes."""
        cfg, prog = self.cfg, self.prog
        try:
            anneal = anneal_decision(cfg.stop_rule, cfg.decide_by, cfg.eval_every, prog)
            stop = early_stop_step(cfg.patience, cfg.patience_from_step, cfg.decide_by, cfg.eval_every, prog)
        except KeyError as e:
            raise self.refuse(
                self.changes, f"the evals it recorded do not score {e}, which it decides by"
            ) from None
        new_start = (anneal[0] if anneal else None) if self.stable else cfg.anneal_start
        end = new_start if self.stable else (cfg.end_step if cfg.end_step is not None else cfg.planned_steps)
        if stop is not None and stop < prog.step:
            end = stop
        if end is not None and end < prog.step:
            raise self.refuse(
                self.changes, f"it has trained to step {prog.step}, past the new plan's end at step {end}"
            )
        old_start = prog.anneal_start if self.stable else cfg.anneal_start
        old_planned = self.changes.get("planned_steps", (cfg.planned_steps,))[0]
        if other := _first_other_step(cfg, old_planned, old_start, new_start, prog.step):
            step, what, a, b = other
            raise self.refuse(
                self.changes,
                f"the new plan gives step {step}, already trained, another {what} ({a} → {b}): the steps "
                "trained are not what it trains",
            )
        until = f"to step {cfg.stop_rule.max_step} at most (auto-anneal decides)" if cfg.stop_rule else ""
        if ended := self.ended():
            if prog.stopped:
                same = stop == prog.step
            else:
                same = new_start == prog.anneal_start if self.stable else end == prog.step
            if same:
                return f"the new plan ends it there too (step {prog.step})"
            ends = f"would end it at step {end}" if end is not None else f"would train on, {until}"
            raise self.refuse(self.changes, f"{ended}, and the new plan {ends}")
        if self.stable:
            prog.anneal_start, prog.anneal_reason = anneal or (None, None)
        if stop == prog.step:
            prog.stopped = "early_stop"
        changed = {k: list(v) for k, v in self.changes.items()}
        prog.plan_changes.append({"step": prog.step, "changed": changed})
        if prog.stopped or end == prog.step:
            goes = f"the new plan ends it here, at step {prog.step}"
        else:
            goes = f"the run goes on, {until}" if end is None else f"the run goes on to step {end}"
        return f"the steps trained are what it trains, so {goes}"


def settle(path: Path, state: dict[str, Any], cfg: TrainConfig, prog: Progress, is_main: bool = True) -> None:
    """Refuse the resume of ``state`` (the checkpoint at ``path``) under ``cfg`` where the plan
    changed and the run's history is not the new plan's; otherwise set ``prog`` to the new plan's
    decisions (the stable phase's anneal start, an early stop it takes here) and record the change."""
    recorded = state.get("config") or {}
    old, new = plan_of(recorded), plan_of(cfg.to_dict())
    plan_keys = [*PLAN, *sorted(k for k in old.keys() | new.keys() if k.startswith("stop_rule."))]
    r = _Resume(path, cfg, prog, recorded, _changed(old, new, plan_keys), _changed(old, new, EVALS))
    r.check_what_no_replay_answers()
    if not r.changes:
        return
    where = r.follow()
    if is_main:
        log.info("%s: the plan changed at step %d (%s); %s", cfg.out_dir, prog.step, _said(r.changes), where)
