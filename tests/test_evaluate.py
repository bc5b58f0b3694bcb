"""evaluate's metrics.json: metrics are nested by name, so branch and source names may hold dots;
they are flattened only at the edges (JSON lines, MLflow)."""

from __future__ import annotations

from lehr.engine.metrics import flatten


def test_metrics_are_flattened_only_at_the_edge_and_keep_dots_in_names():
    nested = {"step": 40, "news.v2": {"bpb": 1.0}, "heldout": {"loss": 2.0}}
    assert flatten(nested) == {"step": 40, "news.v2.bpb": 1.0, "heldout.loss": 2.0}


def _branch(root, step: int, end: int, best: bool):
    import json

    (root / "final").mkdir(parents=True)
    (root / "final" / "state.json").write_text(
        json.dumps({"progress": {"step": step}, "config": {"end_step": end, "total_steps": 999}})
    )
    if best:
        (root / "best").mkdir()
        (root / "best" / "state.json").write_text("{}")
    return root


def test_an_early_stopped_branch_is_scored_by_its_best_weights(tmp_path):
    from lehr.pipelines.evaluate.nodes import scored_weights

    stopped = _branch(tmp_path / "stopped", step=700, end=770, best=True)
    assert scored_weights(stopped) == ("best", stopped / "best")
    finished = _branch(tmp_path / "finished", step=770, end=770, best=True)
    assert scored_weights(finished) == ("final", finished / "final")
    no_best = _branch(tmp_path / "no-best", step=700, end=770, best=False)
    assert scored_weights(no_best) == ("final", no_best / "final")
