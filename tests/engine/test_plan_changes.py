"""A run resumed under another plan (budget, stop rule, early stop: settings that may change on
resume but decide where a run ends or a step's learning rate) trains to the new plan only where
the steps it trained are the new plan's; a run that ended under the old plan, or whose trained
steps the new plan would have trained otherwise, is refused before any work. Never "nothing
trained" under a plan it was not trained under."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal
from pathlib import Path

import pytest
from kedro.config import OmegaConfigLoader

from lehr.__main__ import main
from lehr.catalog import ShardsDataset
from lehr.config_parts import from_mapping
from lehr.engine.artifacts import checkpoint
from lehr.engine.artifacts.checkpoint import CheckpointError
from lehr.engine.config import StopRule, TrainConfig
from lehr.engine.model import preset
from lehr.engine.run.loop import train
from lehr.engine.run.plan import settle
from lehr.engine.run.stopping import Progress
from lehr.params.stages import PretrainParams
from lehr.training.job import run_engine, stable_job
from tests import ROOT

STOPPED: list[int] = []


def stop_after_step_3():
    """Engine callback factory: a SIGTERM to this process once the log passes step 3 (the loop
    finishes the next step, checkpoints it and returns)."""

    def see(records: list[dict]) -> None:
        if not STOPPED and any(r.get("step", 0) >= 3 for r in records):
            STOPPED.append(1)
            os.kill(os.getpid(), signal.SIGTERM)

    return see


def _stable(run: Path, planned_steps: int) -> dict:
    """A stable phase planned as the stage plans one: the anneal at 5/6 of planned_steps."""
    rule = StopRule(
        planned_step=round(planned_steps * 5 / 6),
        min_step=planned_steps // 2,
        max_step=round(planned_steps * 0.9),
        auto=False,
        stall_window=2,
        stall_eps=0.0,
        save_to=str(run / "pre_anneal"),
    )
    return dict(out_dir=str(run), planned_steps=planned_steps, stop_rule=rule, eval_every=10, ckpt_every=10)


def snapshot(folder: Path) -> dict:
    """Every file under ``folder``: its bytes' sha256 and its modification time."""
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_stable_phase_that_ended_under_another_plan_is_refused_and_nothing_changes(tiny_config, tmp_path):
    run = tmp_path / "pinned"
    ended = train(tiny_config(**_stable(run, 12)))
    assert ended["step"] == 10 and ended["pre_anneal"]
    before = snapshot(run)
    with pytest.raises(CheckpointError) as refused:
        train(tiny_config(**_stable(run, 18)))
    said = str(refused.value)
    assert "\n" not in said
    assert f"refusing to resume {run} " in said
    assert "planned_steps 12 → 18" in said and "stop_rule.planned_step 10 → 15" in said
    assert "its stable phase ended at step 10 under the old plan" in said
    assert "the new plan would end it at step 15" in said
    assert "Set the old value(s) back" in said
    assert 'pretrain.run_name=<a new name>, or pretrain.run_name="" for a folder keyed by the plan' in said
    assert snapshot(run) == before
    # Under its own plan it is finished, as before: nothing trained, nothing written.
    again = train(tiny_config(**_stable(run, 12)))
    assert again["mode"] == "resume" and again["step"] == 10
    assert snapshot(run) == before


def test_the_trackers_case_a_pinned_stable_run_planned_longer_is_refused_by_its_stage(smoke_shards, tmp_path):
    """The smoke profile's stable phase under ``pretrain.run_name: pinned``: auto-anneal's cap ends
    it at step 11 of 12; planned 16 steps, it would have trained on (to step 14 at most), so the
    stage refuses, where it once said "nothing trained" with the new plan in its record."""
    raw = OmegaConfigLoader(
        conf_source=str(ROOT / "conf"),
        base_env="base",
        default_run_env="smoke",
        merge_strategy={"parameters": "soft"},
    )
    p = from_mapping(PretrainParams, raw["parameters"]["pretrain"], "pretrain")
    quick = dict(eval_every=10, eval_windows=4, task_examples=0, sample_tokens=0, branch_points=[])
    p = dataclasses.replace(p, run_name="pinned", planned_steps=12, **quick)
    shards = ShardsDataset(str(smoke_shards)).load()
    ended = run_engine(stable_job(p, shards, tmp_path, {}), p)
    assert (ended["step"], ended["anneal_reason"]) == (11, "cap")
    before = snapshot(tmp_path / "pinned")
    longer = dataclasses.replace(p, planned_steps=16)
    with pytest.raises(CheckpointError) as refused:
        run_engine(stable_job(longer, shards, tmp_path, {}), longer)
    said = str(refused.value)
    assert said.startswith("refusing to resume ") and "/pinned (step_00000011) under another plan" in said
    assert "planned_steps 12 → 16" in said and "stop_rule.max_step 11 → 14" in said
    assert "its stable phase ended at step 11 under the old plan (the anneal start, cap;" in said
    assert "the new plan would train on, to step 14 at most (auto-anneal decides)" in said
    assert "pretrain.run_name=<a new name>" in said
    assert snapshot(tmp_path / "pinned") == before


def test_a_stopped_stable_phase_goes_on_to_a_longer_plan_as_if_planned_so(
    tiny_config, tmp_path, caplog, capsys
):
    """Its trained steps are the longer plan's (WSD's stable LR does not depend on the plan): it
    trains to the new anneal start, to the bytes of a run planned so from the start."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = dict(log_every=3)
    assert train(tiny_config(**_stable(straight, 24), **common))["step"] == 20
    STOPPED.clear()
    stopped = train(tiny_config(**_stable(resumed, 12), **common), [f"{__name__}:stop_after_step_3"])
    assert stopped["stopped"] == "signal" and stopped["step"] == 4
    with caplog.at_level("INFO", logger="lehr.train"):
        summary = train(tiny_config(**_stable(resumed, 24), **common))
    assert summary["mode"] == "resume" and summary["step"] == 20 and summary["anneal_start"] == 20
    told = [r.getMessage() for r in caplog.records if "the plan changed" in r.getMessage()]
    assert len(told) == 1, told
    assert "the plan changed at step 4 (planned_steps 12 → 24, " in told[0]
    assert told[0].endswith("the run goes on to step 20")
    for f in ("model.safetensors", "optimizer.pt", "rng_rank0.pt"):
        assert (straight / "pre_anneal" / f).read_bytes() == (resumed / "pre_anneal" / f).read_bytes(), f
    state = checkpoint.verify(resumed / "pre_anneal")
    assert state["config"]["planned_steps"] == 24
    (change,) = state["progress"]["plan_changes"]
    assert change["step"] == 4 and change["changed"]["planned_steps"] == [12, 24]
    assert change["changed"]["stop_rule.planned_step"] == [10, 20]
    capsys.readouterr()
    assert main(["info", str(resumed / "pre_anneal")]) == 0
    assert re.search(r"plan changed at step 4 +planned_steps 12 → 24, ", capsys.readouterr().out)


def test_a_plan_that_gives_trained_steps_other_learning_rates_is_refused(tiny_config, tmp_path):
    """The cosine's shape follows planned_steps: a longer plan would have trained steps 6 to 9 at
    higher rates. (A WSD run's budget may grow: test_resume's changed-math test.)"""
    cosine = dict(schedule="cosine", warmup_steps=5)
    train(tiny_config(planned_steps=20, end_step=10, **cosine))
    run = tmp_path / "run"
    before = snapshot(run)
    with pytest.raises(CheckpointError) as refused:
        train(tiny_config(planned_steps=30, **cosine))
    said = str(refused.value)
    assert "planned_steps 20 → 30, end_step 10 → none" in said
    assert "the new plan gives step 6, already trained, another learning rate" in said
    assert snapshot(run) == before
    # The same plan's end, no longer cut short: the trained steps are its own, so it goes on.
    assert train(tiny_config(planned_steps=20, **cosine))["step"] == 20


def test_a_run_that_ended_with_a_tail_average_is_not_trained_on_from_its_averaged_weights():
    """At its end a tail-averaged run's weights are the average: steps past it would start there."""
    tailed = dict(
        init_from="pre_anneal", anneal_start=0, anneal_steps=40, tail_steps=10, decay_shape="linear"
    )
    old, new = _config(end_step=40, **tailed), _config(end_step=60, **tailed)
    with pytest.raises(
        CheckpointError, match=r"end_step 40 → 60\): it reached its decay's end at step 40, where its tail"
    ):
        settle(Path("runs/x/checkpoints/step_00000040"), {"config": old.to_dict()}, new, Progress(step=40))
    settle(Path("runs/x/checkpoints/step_00000030"), {"config": old.to_dict()}, new, Progress(step=30))


# -- the decisions, replayed over a run's recorded history (no training) ---------------------------


def _config(**overrides) -> TrainConfig:
    base = dict(model=preset("tiny", 512), shards="shards", out_dir="runs/x", planned_steps=100)
    return TrainConfig(**{**base, "eval_every": 10, **overrides})


def _evals(*losses: float, every: int = 10) -> list[dict]:
    return [{"step": every * (i + 1), "heldout": {"loss": loss}} for i, loss in enumerate(losses)]


def _settle(old: TrainConfig, new: TrainConfig, prog: Progress) -> Progress:
    settle(Path("runs/x/checkpoints/step_00000060"), {"config": old.to_dict()}, new, prog)
    return prog


def test_an_early_stop_the_new_patience_would_have_taken_earlier_is_refused():
    branch = dict(init_from="pre_anneal", patience_from_step=20)
    prog = Progress(step=60, evals=_evals(5.0, 4.0, 4.1, 4.2, 4.3, 3.9))  # best at 20, then 60
    with pytest.raises(CheckpointError, match=r"patience 4 → 2\): it has trained to step 60, past the new"):
        _settle(_config(patience=4, **branch), _config(patience=2, **branch), Progress(**vars(prog)))
    with pytest.raises(CheckpointError, match=r"anneal.branch=<a new name>"):
        _settle(_config(patience=4, **branch), _config(patience=2, **branch), Progress(**vars(prog)))
    # A run that stopped early and is asked for more patience would have trained on: refused.
    stopped = Progress(step=50, evals=_evals(5.0, 4.0, 4.1, 4.2, 4.3), stopped="early_stop")
    with pytest.raises(CheckpointError, match=r"it stopped at step 50 under the old plan \(early stop\)"):
        _settle(_config(patience=3, **branch), _config(patience=5, **branch), stopped)
    # More patience for a run still going, which neither plan would have stopped yet: it goes on.
    going = _settle(_config(patience=4, **branch), _config(patience=5, **branch), Progress(**vars(prog)))
    assert going.plan_changes == [{"step": 60, "changed": {"patience": [4, 5]}}] and going.stopped is None


def test_auto_anneal_replayed_under_new_bounds():
    def rule(min_step: int, max_step: int) -> StopRule:
        return StopRule(
            planned_step=70,
            min_step=min_step,
            max_step=max_step,
            auto=True,
            stall_window=2,
            stall_eps=0.0,
            save_to="runs/x/pre_anneal",
        )

    flat_at_40 = _evals(5.0, 4.0, 3.0, 3.5, 2.0, 1.0)  # stalls at step 40 (and only there)
    old = _config(stop_rule=rule(50, 90))
    # A lower min_step: the new plan would have annealed at step 40, and the run trained to 60.
    with pytest.raises(CheckpointError, match=r"stop_rule.min_step 50 → 30\): it has trained to step 60"):
        _settle(old, _config(stop_rule=rule(30, 90)), Progress(step=60, evals=flat_at_40))
    # A higher cap for a run that has not stalled: it goes on, auto-anneal deciding.
    going = _settle(old, _config(stop_rule=rule(50, 95)), Progress(step=60, evals=flat_at_40))
    assert going.anneal_start is None and going.plan_changes[0]["changed"] == {"stop_rule.max_step": [90, 95]}
    # ...but its evals were made over other windows than the new plan's: its stall would compare those.
    with pytest.raises(CheckpointError, match=r"eval_windows 32 → 64\): its end is decided by evals"):
        _settle(old, _config(stop_rule=rule(50, 95), eval_windows=64), Progress(step=60, evals=flat_at_40))
    # Without auto-anneal no decision reads the evals: other eval windows change no plan.
    planned = dataclasses.replace(rule(50, 90), auto=False)
    same = _settle(
        _config(stop_rule=planned),
        _config(stop_rule=planned, eval_windows=64),
        Progress(step=60, evals=flat_at_40, anneal_start=70, anneal_reason="planned"),
    )
    assert same.plan_changes == [] and same.anneal_start == 70


def test_a_branch_resumed_with_the_other_optimizer_state_is_refused():
    old = _config(init_from="pre_anneal", init_optimizer=True)
    with pytest.raises(CheckpointError, match=r"init_optimizer True → False\): its steps from pre_anneal on"):
        _settle(old, dataclasses.replace(old, init_optimizer=False), Progress(step=60))
    # A run that did not branch never read the setting.
    plain = _config()
    unread = _settle(plain, dataclasses.replace(plain, init_optimizer=False), Progress(step=60))
    assert unread.plan_changes == []


def test_an_older_record_reads_the_keys_it_lacks_at_their_defaults():
    """Checkpoints before the plan was compared record no ``plan_changes``; older ones miss keys
    added since (read at their defaults, under which they trained)."""
    record = {k: v for k, v in _config().to_dict().items() if k not in ("decide_by", "patience")}
    prog = Progress.from_state({"step": 60, "evals": []})
    settle(Path("step_00000060"), {"config": record}, _config(), prog)
    assert prog.plan_changes == []
    assert json.loads(json.dumps(vars(prog)))["plan_changes"] == []
