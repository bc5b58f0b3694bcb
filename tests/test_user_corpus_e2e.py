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


def test_a_queued_sweep_trains_each_value_and_lands_in_the_projects_mlflow(repo):
    """`dvc exp run --queue` over two learning rates, then `dvc queue start -j 2`: each experiment
    runs in a temporary workspace (no rolling checkpoints; the corpus from DVC's cache), trains its
    own stable phase, shows in `dvc exp show`, and its MLflow runs land in the project's store."""
    import mlflow

    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "baseline")
    sh(
        repo,
        "dvc",
        "exp",
        "run",
        "--queue",
        "-S",
        "conf/base/parameters_pretrain_stable.yml:pretrain.lr=choice(0.002,0.004)",
    )
    sh(repo, "dvc", "queue", "start", "-j", "2", extra_env={"LEHR_MLFLOW": "1"})
    deadline, status = time.time() + 900, ""
    while time.time() < deadline:
        status = sh(repo, "dvc", "queue", "status").stdout
        if "Queued" not in status and "Running" not in status:
            break
        time.sleep(2)
    assert status.count("Success") == 2, status
    shown = json.loads(sh(repo, "dvc", "exp", "show", "--json").stdout)
    exps = {
        e["name"]: e["revs"][0]["data"]
        for commit in shown
        for e in (commit.get("experiments") or [])
        if e.get("name")
    }
    lrs = {}
    for name, data in exps.items():
        stable = data["metrics"]["data/08_reporting/stable_metrics.json"]["data"]
        assert stable["step"] > 0 and data["metrics"]["data/08_reporting/metrics.json"]["data"]["branches"]
        lrs[name] = data["params"]["conf/base/parameters_pretrain_stable.yml"]["data"]["pretrain"]["lr"]
    assert sorted(lrs.values()) == [0.002, 0.004], exps.keys()
    mlflow.set_tracking_uri(f"sqlite:///{repo / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["lehr"])
    trained = runs[runs["tags.lehr.stage"] == "pretrain_stable"]
    assert set(lrs) <= set(trained["tags.dvc.exp_name"]), trained["tags.dvc.exp_name"].tolist()
    assert not list((repo / ".dvc/tmp/exps").rglob("mlflow.db"))
