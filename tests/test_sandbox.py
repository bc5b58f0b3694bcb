"""`make smoke` runs the whole pipeline in a sandbox (a throwaway copy of the project as its own
git + DVC repo): the project's tracked files, dvc.lock and workspace outputs stay as they were."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from lehr import sandbox
from tests import ROOT
from tests.e2e import ARTIFACTS, env, lock_hash


def _state() -> tuple[str, str]:
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    lock = ROOT / "dvc.lock"
    return status.stdout, hashlib.sha256(lock.read_bytes()).hexdigest() if lock.is_file() else ""


def test_a_folder_lehr_did_not_make_is_never_replaced(tmp_path):
    theirs = tmp_path / "mine"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="is not a lehr sandbox"):
        sandbox.create(ROOT, theirs, "smoke")
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"]


@pytest.mark.slow
def test_make_smoke_runs_every_stage_in_a_sandbox_and_leaves_the_project_as_it_was(tmp_path, smoke_repo):
    """...and gives the dvc.lock of every other fresh run of this commit elsewhere (the session's
    smoke repo, in another folder): no path and no clock time reaches a data or model output."""
    before = _state()
    dest = tmp_path / "smoke"
    for _ in range(2):  # a second `make smoke` replaces the sandbox the first one made
        subprocess.run(
            ["make", "smoke", f"SMOKE={dest}"], cwd=ROOT, env=env(), check=True, capture_output=True
        )
    assert _state() == before
    assert (dest / "conf/profile.yaml").read_text() == "profile: smoke\n"
    assert (dest / "data/08_reporting/metrics.json").is_file() and (dest / "dvc.lock").is_file()
    reference = smoke_repo.parent / "reference" / "dvc.lock"
    for artifact in ARTIFACTS:
        assert lock_hash(dest / "dvc.lock", artifact) == lock_hash(reference, artifact), artifact
