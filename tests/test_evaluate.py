"""evaluate's metrics.json: keys are paths, so branch and source names may hold dots."""

from __future__ import annotations

from lehr.pipelines.evaluate.nodes import _nest


def test_metric_paths_keep_dots_in_source_names():
    assert _nest({"news.v2.bpb": 1.0, "heldout.loss": 2.0}) == {"news.v2": {"bpb": 1.0}, "heldout": {"loss": 2.0}}
