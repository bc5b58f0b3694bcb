"""`make smoke`'s sandbox (a throwaway copy of the project as its own git + DVC repo) replaces only
what lehr made. That `make smoke` runs every stage there and leaves the project as it was is part
of the README's tour (tests/test_readme_tour.py)."""

from __future__ import annotations

import subprocess

import pytest

from lehr.project import sandbox
from tests import ROOT


def test_a_folder_lehr_did_not_make_is_never_replaced(tmp_path):
    theirs = tmp_path / "mine"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="is not a lehr sandbox"):
        sandbox.create(ROOT, theirs, "smoke")
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"]


def test_a_sandbox_with_your_commits_or_experiments_is_kept(tmp_path):
    """`make smoke` replaces its own sandbox, but not the work a person did in it (the README's tour
    commits a baseline and runs experiments there)."""
    dest = sandbox.create(ROOT, tmp_path / "smoke", "smoke")
    assert sandbox.own_work(dest) == []
    sandbox.create(ROOT, dest, "smoke")  # nothing of anyone's: replaced
    (dest / "notes.txt").write_text("mine\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "mine"], cwd=dest, check=True)
    subprocess.run(["git", "update-ref", "refs/exps/ab/cdef/linear", "HEAD"], cwd=dest, check=True)
    assert sandbox.own_work(dest) == ["1 commit(s) of your own", "1 experiment ref(s)"]
    with pytest.raises(FileExistsError, match="make smoke FORCE=1"):
        sandbox.create(ROOT, dest, "smoke")
    assert (dest / "notes.txt").read_text() == "mine\n"
    sandbox.create(ROOT, dest, "smoke", force=True)
    assert not (dest / "notes.txt").exists()


def test_the_ladder_comes_along_only_when_asked_for(tmp_path):
    """Stages the sandbox has never run, without a lock, make `dvc pull` and `dvc checkout` exit
    non-zero (tests/project/test_team.py runs them in a sandbox after its `dvc repro`)."""
    plain = sandbox.create(ROOT, tmp_path / "plain", "smoke")
    assert not (plain / "ladder").exists()
    with_ladder = sandbox.create(ROOT, tmp_path / "ladder", "smoke", ladder=True)
    assert (with_ladder / "ladder/dvc.yaml").read_bytes() == (ROOT / "ladder/dvc.yaml").read_bytes()
    assert not (with_ladder / "ladder/dvc.lock").exists()
