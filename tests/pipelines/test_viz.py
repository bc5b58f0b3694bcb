"""kedro-viz (the optional ``viz`` extra, installed by `make test`) builds a static site of the
five pipelines and their datasets."""

from __future__ import annotations

import importlib.util

import pytest

from tests.e2e import make_repo, sh

pytestmark = pytest.mark.slow


@pytest.mark.skipif(
    importlib.util.find_spec("kedro_viz") is None,
    reason='kedro-viz is the optional extra: pip install -e ".[viz]"',
)
def test_kedro_viz_build_writes_a_static_site(tmp_path, corpus_dir):
    repo = make_repo(tmp_path / "repo", corpus_dir)
    sh(repo, "kedro", "viz", "build", "--include-hooks")
    site = repo / "build"
    assert (site / "index.html").is_file()
    graph = (site / "api" / "main").read_text()
    for name in (
        "tokenize_node",
        "shard_streams_node",
        "train_stable_node",
        "train_anneal_node",
        "evaluate_models_node",
        "pre_anneal",
        "anneal_branches",
    ):
        assert name in graph, name
