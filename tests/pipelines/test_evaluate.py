"""evaluate's metrics.json: metrics are nested by name, so branch and source names may hold dots;
they are flattened only at the edges (JSON lines, MLflow)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from lehr.engine.run.metrics import flatten
from lehr.files.atomic import sha256_file


def test_metrics_are_flattened_only_at_the_edge_and_keep_dots_in_names():
    nested = {"step": 40, "news.v2": {"bpb": 1.0}, "heldout": {"loss": 2.0}}
    assert flatten(nested) == {"step": 40, "news.v2.bpb": 1.0, "heldout.loss": 2.0}


def _branch(root, step: int, end: int, best: bool):
    (root / "final").mkdir(parents=True)
    (root / "final" / "state.json").write_text(
        json.dumps({"progress": {"step": step}, "config": {"end_step": end, "planned_steps": 999}})
    )
    if best:
        (root / "best").mkdir()
        (root / "best" / "state.json").write_text("{}")
    return root


def test_an_early_stopped_branch_is_scored_by_its_best_weights(tmp_path):
    from lehr.pipelines.evaluate.scoring import scored_weights

    stopped = _branch(tmp_path / "stopped", step=700, end=770, best=True)
    assert scored_weights(stopped) == ("best", stopped / "best")
    finished = _branch(tmp_path / "finished", step=770, end=770, best=True)
    assert scored_weights(finished) == ("final", finished / "final")
    no_best = _branch(tmp_path / "no-best", step=700, end=770, best=False)
    assert scored_weights(no_best) == ("final", no_best / "final")


def _made_from(root, pre_anneal, current: bool):
    """A branch whose provenance names ``pre_anneal``'s state.json, as it is now or as it was."""
    digest = sha256_file(pre_anneal / "state.json") if current else "0" * 64
    (root / "final").mkdir(parents=True)
    state = {"progress": {"step": 9}, "config": {"end_step": 9, "planned_steps": 9}}
    state["provenance"] = {"inputs": {str(pre_anneal / "state.json"): digest}}
    (root / "final" / "state.json").write_text(json.dumps(state))
    return root


def test_branches_of_an_earlier_stable_phase_are_left_out_of_all_and_refused_by_name(tmp_path, caplog):
    from lehr.pipelines.evaluate.scoring import chosen_branches, origins

    pre_anneal = tmp_path / "pre_anneal"
    pre_anneal.mkdir()
    (pre_anneal / "state.json").write_text('{"progress": {"step": 6}}')
    branches = {
        "now": _made_from(tmp_path / "anneal" / "now", pre_anneal, current=True),
        "other": _made_from(tmp_path / "anneal" / "other", pre_anneal, current=True),
        "old": _made_from(tmp_path / "anneal" / "old", pre_anneal, current=False),
    }
    anneal = SimpleNamespace(branch="now")
    ours = origins(pre_anneal, {})
    with caplog.at_level(logging.INFO):
        kept = chosen_branches(branches, None, anneal, SimpleNamespace(branches=["all"]), ours)
    assert kept == ["now", "other"] and "earlier stable phase (another pre_anneal): old" in caplog.text
    with pytest.raises(
        ValueError, match=r"branch\(es\) old in .*anneal started from a checkpoint of another"
    ):
        chosen_branches(branches, None, anneal, SimpleNamespace(branches=["old"]), ours)
    with pytest.raises(ValueError, match="branch.*old.*another stable run"):
        chosen_branches(branches, None, SimpleNamespace(branch="old"), SimpleNamespace(branches=[]), ours)
    # A branch from a branch point of this stable run compares with it like one from pre_anneal.
    point = tmp_path / "branch_points" / "tokens-512"
    point.mkdir(parents=True)
    (point / "state.json").write_text('{"progress": {"step": 1}}')
    branches["early"] = _made_from(tmp_path / "anneal" / "early", point, current=True)
    kept = chosen_branches(
        branches, None, anneal, SimpleNamespace(branches=["all"]), origins(pre_anneal, {"tokens-512": point})
    )
    assert kept == ["early", "now", "other"]
