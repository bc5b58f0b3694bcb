"""A user's own corpus, end to end: `make run` never touches it; pointed at it (globals.yml) and
`dvc add`-ed, the stages read it; and a queued `dvc exp run` (a temporary workspace, no rolling
checkpoints, no corpus folder but DVC's cache) reproduces and reports its metrics."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests import ROOT
from tests.e2e import dir_hash, make_repo, sh

pytestmark = pytest.mark.slow


def write_user_corpus(root: Path, corpus_dir: Path) -> None:
    """Five 'novels' in books/ and one held out, as the README's "Your own corpus" says."""
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
    (repo / "conf/base/globals.yml").write_text((ROOT / "conf/base/globals.yml").read_text())
    sh(repo, "dvc", "repro", "shard")  # back to the bundled corpus for the experiment below


def test_queued_experiment_runs_in_its_own_workspace(repo):
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "baseline")
    sh(
        repo,
        "dvc",
        "exp",
        "run",
        "--queue",
        "-n",
        "queued-linear",
        "-S",
        "conf/smoke/parameters_anneal.yml:+anneal.shape=linear",
    )
    sh(repo, "dvc", "queue", "start", "-j", "1")
    deadline, status = time.time() + 600, ""
    while time.time() < deadline:
        status = sh(repo, "dvc", "queue", "status").stdout
        if "Queued" not in status and "Running" not in status:
            break
        time.sleep(2)
    assert "Success" in status, (
        status + sh(repo, "dvc", "queue", "logs", "queued-linear", check=False).stdout[-3000:]
    )
    shown = json.loads(sh(repo, "dvc", "exp", "show", "--json").stdout)
    exps = [
        e for commit in shown for e in (commit.get("experiments") or []) if e.get("name") == "queued-linear"
    ]
    assert exps, shown
    metrics = exps[0]["revs"][0]["data"]["metrics"]
    assert metrics["data/08_reporting/metrics.json"]["data"]["branches"]
