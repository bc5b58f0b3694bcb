"""The experiments DVC keeps as git commits, read back through the catalog's paths: which branch
each trained, the figures a commit holds, and the refusal of a branch by hand that takes an
experiment's name. A git repo of this project's conf and one experiment commit, no DVC run."""

import json
import shutil
import subprocess

import pytest

from lehr.project.experiment_refs import experiment_branches, experiment_ref, refuse_experiment_branch
from lehr.project.experiments import figures
from tests import ROOT


def _git(repo, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo_with_an_experiment(tmp_path):
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "base")
    baseline = _git(tmp_path, "rev-parse", "HEAD")
    reports = tmp_path / "data/08_reporting"
    reports.mkdir(parents=True)
    (reports / "metrics.json").write_text(json.dumps({"anneal": {"branch": "gold-cosine"}}))
    (reports / "scored_items.json").write_text(json.dumps({"heldout": {}}))
    _git(tmp_path, "add", "-f", "data/08_reporting")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "exp")
    _git(tmp_path, "update-ref", experiment_ref(baseline, "exp-1"), "HEAD")
    _git(tmp_path, "reset", "-q", "--hard", baseline)
    return tmp_path, _git(tmp_path, "rev-parse", experiment_ref(baseline, "exp-1"))


def test_an_experiments_branch_and_figures_are_read_where_the_catalog_puts_them(repo_with_an_experiment):
    repo, commit = repo_with_an_experiment
    assert experiment_branches(repo) == {"gold-cosine": "exp-1"}
    metrics, items = figures(repo, commit)
    assert metrics == {"anneal": {"branch": "gold-cosine"}} and items == {"heldout": {}}


def test_a_branch_by_hand_may_not_take_an_experiments_name(repo_with_an_experiment):
    repo, _ = repo_with_an_experiment
    with pytest.raises(
        ValueError, match=r"experiment exp-1's \(data/06_models/anneal/gold-cosine in its commit"
    ):
        refuse_experiment_branch("gold-cosine", repo)
    refuse_experiment_branch("gold-linear", repo)  # a name no experiment holds
