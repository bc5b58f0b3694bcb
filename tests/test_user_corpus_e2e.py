"""A user's own corpus, end to end: `make run` never touches it; pointed at it (globals.yml) and
`dvc add`-ed, the stages read it. (Queued experiments, each in a temporary workspace with the
corpus from DVC's cache, are in the README's tour: tests/test_readme_tour.py.)"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests import ROOT
from tests.e2e import dir_hash, make_repo, sh

pytestmark = pytest.mark.slow


def write_user_corpus(root: Path, corpus_dir: Path) -> None:
    """Five 'novels' in books/ and one held out, as docs/corpus.md says."""
    speeches = sorted((corpus_dir / "silver" / "sotu").iterdir())
    for i in range(6):
        text = "\n\n".join(p.read_text() for p in speeches[i * 4 : (i + 1) * 4])
        dest = root / ("heldout" if i == 5 else "books") / f"novel-{i}.txt"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)


@pytest.fixture(scope="module")
def repo(tmp_path_factory, corpus_dir):
    repo = make_repo(tmp_path_factory.mktemp("user") / "repo", corpus_dir)
    shutil.copy2(ROOT / "Makefile", repo / "Makefile")
    write_user_corpus(repo / "data/01_raw/corpus", corpus_dir)
    return repo


def test_make_run_leaves_a_users_corpus_byte_for_byte(repo):
    before = dir_hash(repo / "data/01_raw/corpus")
    # The README's main command (the sandbox is on the smoke profile), with the venv running the tests.
    sh(repo, "make", "run", f"VENV={Path(sys.executable).parent.parent}")
    assert dir_hash(repo / "data/01_raw/corpus") == before
    assert json.loads((repo / "data/08_reporting/metrics.json").read_text())["pre_anneal"]


def test_own_corpus_is_dvc_added_and_read(repo):
    before = dir_hash(repo / "data/01_raw/corpus")
    sh(repo, "dvc", "add", "data/01_raw/corpus")
    (repo / "conf/base/globals.yml").write_text("corpus: data/01_raw/corpus\n")
    sh(repo, "dvc", "repro", "shard")
    manifest = json.loads((repo / "data/04_feature/shards/manifest.json").read_text())
    assert set(manifest["streams"]) == {"train/books", "heldout/novel-5"}
    assert dir_hash(repo / "data/01_raw/corpus") == before
