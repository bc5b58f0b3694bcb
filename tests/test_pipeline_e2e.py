"""End to end on the smoke profile in a throwaway git repo: a real `dvc repro` of all five stages,
an experiment that re-runs only anneal + evaluate, a Kedro anneal branch beside it, and an
interrupted stable phase that resumes to the same weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from safetensors.torch import load_file

from tests.e2e import dir_hash, env, make_repo, sh, stages_run

pytestmark = pytest.mark.slow
ALL = ["tokenize", "shard", "pretrain-stable", "anneal", "evaluate"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory, corpus_dir):
    path = make_repo(tmp_path_factory.mktemp("e2e") / "repo", corpus_dir)
    out = sh(path, "dvc", "repro")
    assert stages_run(out.stdout) == ALL
    return path


def test_repro_builds_every_artifact_and_a_second_repro_is_a_no_op(repo):
    for artifact in ("data/02_intermediate/tokenizer.json", "data/04_feature/shards/manifest.json",
                     "data/06_models/pre_anneal/model.safetensors", "data/08_reporting/metrics.json",
                     "data/08_reporting/loss_curve.png", "data/08_reporting/curves.csv"):
        assert (repo / artifact).is_file(), artifact
    metrics = json.loads((repo / "data/08_reporting/metrics.json").read_text())
    for key in ("pre_anneal", "anneal", "anneal_gain", "unigram"):
        assert "bpb" in metrics[key]["heldout"]
    assert set(metrics["pre_anneal"]) >= {"wikipedia", "sotu", "heldout"}
    started = time.perf_counter()
    again = sh(repo, "dvc", "repro")
    assert stages_run(again.stdout) == [] and "is cached" not in again.stdout
    assert time.perf_counter() - started < 3.0


def test_experiment_reruns_only_anneal_and_evaluate(repo):
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "first run")
    pre = dir_hash(repo / "data/06_models/pre_anneal")
    out = sh(repo, "dvc", "exp", "run", "-n", "linear-decay", "-S", "conf/base/parameters_anneal.yml:anneal.shape=linear")
    assert stages_run(out.stdout) == ["anneal", "evaluate"]
    assert dir_hash(repo / "data/06_models/pre_anneal") == pre
    shown = json.loads(sh(repo, "dvc", "exp", "show", "--json").stdout)
    names = set()
    for rev in shown:
        for exp in rev.get("experiments") or []:
            for run in exp.get("revs", []):
                names.add(run["name"])
                data = run["data"]
                assert "data/08_reporting/metrics.json" in data["metrics"]
    assert "linear-decay" in names


def test_kedro_anneal_branch_lives_beside_others_and_leaves_pre_anneal_alone(repo):
    pre = dir_hash(repo / "data/06_models/pre_anneal")
    before = {p.name: dir_hash(p) for p in (repo / "data/06_models/anneal").iterdir() if not p.name.startswith(".")}
    sh(repo, "kedro", "run", "--pipeline", "anneal", "--env", "smoke",
       "--params", "anneal.branch=gold-cosine,anneal.shape=cosine")
    after = {p.name: dir_hash(p) for p in (repo / "data/06_models/anneal").iterdir() if not p.name.startswith(".")}
    assert dir_hash(repo / "data/06_models/pre_anneal") == pre
    assert "gold-cosine" in after and all(after[name] == h for name, h in before.items())
    listing = sh(repo, "python", "-m", "lehr", "branches").stdout
    assert "gold-cosine" in listing


def test_unknown_branch_asked_of_evaluate_is_refused(repo):
    out = sh(repo, "kedro", "run", "--pipeline", "evaluate", "--env", "smoke",
             "--params", "evaluate.branches=[nope]", check=False)
    assert out.returncode != 0
    assert "unknown anneal branch(es) nope" in out.stderr


def test_killed_stable_phase_resumes_to_the_same_weights(tmp_path, repo, corpus_dir):
    other = make_repo(tmp_path / "repo", corpus_dir)
    for stage in ("tokenize", "shard"):
        sh(other, "dvc", "repro", stage)
    latest = other / "data/06_models/stable_run/smoke/checkpoints/latest"
    proc = subprocess.Popen(["dvc", "repro", "pretrain-stable"], cwd=other, env=env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not latest.exists():
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert latest.exists(), "the stage never wrote a checkpoint"
    out = sh(other, "dvc", "repro", "pretrain-stable")
    assert "resumed from checkpoint" in out.stderr
    a = load_file(repo / "data/06_models/pre_anneal/model.safetensors")
    b = load_file(other / "data/06_models/pre_anneal/model.safetensors")
    assert all((a[k] == b[k]).all() for k in a)
