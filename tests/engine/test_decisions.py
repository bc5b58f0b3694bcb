"""The loop's decisions, alone: the stop policies (auto-anneal on a stall, the cap, the planned
start, early stopping, divergence), and which data mix a step of a staged anneal draws from."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lehr.engine.config import StopRule
from lehr.engine.run.stopping import (
    AnnealCap,
    AutoAnneal,
    DivergedError,
    Divergence,
    EarlyStop,
    PlannedAnneal,
    Progress,
    policies,
    stalled,
)
from lehr.engine.schedule import mix_at


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


def _evals(*losses, start=10, every=10):
    return [{"step": start + i * every, "heldout": {"loss": loss}} for i, loss in enumerate(losses)]


RULE = StopRule(
    planned_step=80, min_step=50, max_step=90, auto=True, stall_window=4, stall_eps=0.01, save_to=""
)


def test_auto_anneal_waits_for_min_step_then_starts_on_a_stall():
    policy = AutoAnneal(RULE)
    flat = _evals(5.0, 4.0, 4.0, 4.0)  # stalled, but at step 40 < min_step
    prog = Progress(step=40, evals=flat)
    policy.after_eval(prog)
    assert prog.anneal_start is None
    prog = Progress(step=60, evals=_evals(5.0, 4.0, 3.99, 3.995, 3.999, 3.998))
    policy.after_eval(prog)
    assert (prog.anneal_start, prog.anneal_reason) == (60, "stall")


def test_the_cap_ends_the_stable_phase_at_max_step_and_never_moves_a_decided_start():
    cap = AnnealCap(RULE)
    prog = Progress(step=89)
    cap.after_step(prog)
    assert prog.anneal_start is None
    prog.step = 90
    cap.after_step(prog)
    assert (prog.anneal_start, prog.anneal_reason) == (90, "cap")
    decided = Progress(step=95, anneal_start=60, anneal_reason="stall")
    cap.after_step(decided)
    assert decided.anneal_start == 60


def test_without_auto_anneal_the_planned_start_is_set_before_the_first_step():
    prog = Progress()
    PlannedAnneal(replace(RULE, auto=False)).at_start(prog)
    assert (prog.anneal_start, prog.anneal_reason) == (80, "planned")


def test_early_stop_counts_patience_from_its_step_only():
    stop = EarlyStop(patience=2, from_step=30)
    # The best before from_step (step 10) does not count; from step 30 the best is at 40.
    assert stop.after_eval(Progress(step=50, evals=_evals(1.0, 3.0, 2.9, 2.5, 2.6))) is None
    assert stop.after_eval(Progress(step=60, evals=_evals(1.0, 3.0, 2.9, 2.5, 2.6, 2.7))) == "early_stop"
    assert stop.after_eval(Progress(step=20, evals=_evals(3.0, 3.1))) is None  # before from_step


def _task_evals(*accs, start=10, every=10):
    # The held-out loss keeps falling while the task accuracy peaks and drops: the two disagree.
    return [
        {"step": start + i * every, "heldout": {"loss": 5.0 - i}, "tasks": {"cloze": {"acc": a}}}
        for i, a in enumerate(accs)
    ]


def test_early_stop_and_auto_anneal_can_go_by_a_task_metric_where_higher_is_better():
    evals = _task_evals(0.1, 0.3, 0.5, 0.4, 0.45, 0.42)
    prog = Progress(step=60, evals=evals)
    assert EarlyStop(patience=3, from_step=10).after_eval(prog) is None  # held-out loss: still improving
    assert EarlyStop(patience=3, from_step=10, metric="tasks.cloze.acc").after_eval(prog) == "early_stop"
    assert prog.best_at("tasks.cloze.acc") == 2 and prog.best_at("heldout.loss") == 5
    flat = Progress(step=60, evals=_task_evals(0.1, 0.3, 0.5, 0.5, 0.505, 0.5))
    AutoAnneal(RULE, "tasks.cloze.acc").after_eval(flat)  # gain 0.005 < stall_eps 0.01
    assert (flat.anneal_start, flat.anneal_reason) == (60, "stall")
    rising = Progress(step=60, evals=_task_evals(0.1, 0.3, 0.5, 0.5, 0.6, 0.7))
    AutoAnneal(RULE, "tasks.cloze.acc").after_eval(rising)
    assert rising.anneal_start is None


def test_decide_by_must_name_a_metric_the_evals_score(tiny_config):
    from lehr.config_parts import ConfigError

    with pytest.raises(ConfigError, match="decide_by = 'heldout.ppl' must be one of heldout.loss"):
        tiny_config(decide_by="heldout.ppl")
    with pytest.raises(ConfigError, match="names a task the evals do not score: the tasks are cloze"):
        tiny_config(decide_by="tasks.lambada.acc", task_files={"cloze": "c.jsonl"})
    with pytest.raises(ConfigError, match="task_examples = 0"):
        tiny_config(decide_by="tasks.cloze.acc", task_files={"cloze": "c.jsonl"}, task_examples=0)
    assert tiny_config(decide_by="tasks.cloze.acc_norm", task_files={"cloze": "c.jsonl"}).decide_by


def test_divergence_aborts_at_its_limit_except_under_fp16_loss_scaling():
    with pytest.raises(DivergedError, match="3 consecutive non-finite steps"):
        Divergence(limit=3, precision="fp32").check(3, step=12, checkpoints="runs/x")
    Divergence(limit=3, precision="fp32").check(2, step=12, checkpoints="runs/x")
    Divergence(limit=3, precision="fp16").check(9, step=12, checkpoints="runs/x")  # the scaler handles it


def test_the_config_chooses_the_policies(tiny_config):
    assert policies(tiny_config()) == []
    assert [type(p) for p in policies(tiny_config(stop_rule=RULE, patience=3))] == [
        AutoAnneal,
        AnnealCap,
        EarlyStop,
    ]
    assert [type(p) for p in policies(tiny_config(stop_rule=replace(RULE, auto=False)))] == [PlannedAnneal]


def test_a_checkpoint_with_flat_evals_resumes_with_them_nested():
    saved = {"step": 40, "tokens": 9, "evals": [{"step": 40, "heldout.loss": 4.5, "news.v2.bpb": 2.0}]}
    prog = Progress.from_state(saved)
    assert prog.evals == [{"step": 40, "heldout": {"loss": 4.5}, "news.v2": {"bpb": 2.0}}]
    assert prog.scores("heldout.loss") == [4.5]
