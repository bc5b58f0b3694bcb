"""A full disk and a file-size limit, for real, during each training stage and during `evaluate`:
the stage says so in one line, with no traceback, and exits non-zero; every file that was there
before is there byte for byte, and nothing half-written is left.

Two faults, nothing patched: ``prlimit --fsize`` (EFBIG) and a tmpfs a little larger than the
project's ``data/`` folder, copied onto it and bind-mounted over it in a private mount namespace
(ENOSPC). Each stage is run where it writes most: a fresh stable run (its first rolling
checkpoint), a finished stable run run again (its copy of ``pre_anneal``), a finished anneal run
again (its copy of the branch) and evaluate (its reports). MLflow is off: its store has its own
test (test_operator_faults.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import faults
from tests.e2e import env, sh

pytestmark = pytest.mark.integration

RUNS = {
    "fresh stable run": ["pretrain_stable", "--params"],  # a data seed of its own per fault: a new run
    "stable run's pre_anneal copy": ["pretrain_stable"],
    "anneal branch copy": ["anneal", "--params", "anneal.branch=by-hand"],  # trained by the fixture
    "evaluate's reports": ["evaluate"],
}
# The room a run leaves: less than it writes there (evaluate's reports are a few KB each).
ROOM = {"fresh stable run": 100_000, "stable run's pre_anneal copy": 100_000, "anneal branch copy": 100_000}
SAYS = {
    "fresh stable run": "could not write data/06_models/stable_run/",
    "stable run's pre_anneal copy": "no room writing data/06_models/pre_anneal/",
    "anneal branch copy": "no room writing data/06_models/branches/by-hand/",
    "evaluate's reports": "no room writing data/08_reporting/",
}
# Lock files name their last holder, and Kedro writes its own session store: neither is an artifact.
_NOT_ARTIFACTS = (".lehr.lock",)
_HASH_TREE = """
import hashlib, json, sys
from pathlib import Path
root = Path(sys.argv[1])
print(json.dumps({str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".lehr.lock")}))
"""


def tree(data: Path) -> dict[str, str]:
    return {
        str(p.relative_to(data)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(data.rglob("*"))
        if p.is_file() and not p.name.endswith(_NOT_ARTIFACTS)
    }


@pytest.fixture(scope="module")
def repo(tmp_path_factory, smoke_repo):
    path = tmp_path_factory.mktemp("full-disk") / "repo"
    shutil.copytree(smoke_repo, path, symlinks=True)
    # A branch by hand (DVC's own may not be run by `kedro run`), finished: run again, it only copies.
    sh(path, "kedro", "run", "--pipelines", "anneal", "--env", "smoke", "--params", "anneal.branch=by-hand")
    return path


@pytest.mark.parametrize("fault", ["file-size limit", "full disk"])
@pytest.mark.parametrize("run", list(RUNS))
def test_a_stage_out_of_room_says_so_in_one_line_and_keeps_every_file(repo, tmp_path, run, fault):
    data = repo / "data"
    before, room = tree(data), ROOM.get(run, 3000)
    kedro = ["kedro", "run", "--pipelines", *RUNS[run], "--env", "smoke"]
    if run == "fresh stable run":
        kedro.insert(5, f"pretrain.data_seed={7 if fault == 'file-size limit' else 8}")
    if fault == "file-size limit":
        out = subprocess.run(
            ["prlimit", f"--fsize={room}", *kedro], cwd=repo, env={**env(), "LEHR_MLFLOW": "0"},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        returncode, after = out.returncode, tree(data)
    else:
        if not faults.full_disk_allowed(tmp_path / "probe"):
            pytest.skip("this machine refuses user namespaces, so no tmpfs can be mounted as a full disk")
        disk = tmp_path / "disk"
        disk.mkdir()
        size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file()) + (8 << 20)
        script = (
            f"mount -t tmpfs -o size={size} tmpfs {disk} && cp -a data/. {disk}/ && "
            f"mount --bind {disk} data && "
            f"fill=$(( $(df --output=avail -B1 data | tail -1) - {room} )) && "
            f'head -c "$fill" /dev/zero > {disk}/.filler; '
            f"{' '.join(kedro)}; echo $? > {tmp_path}/rc; rm {disk}/.filler; "
            f"{sys.executable} -c '{_HASH_TREE}' data > {tmp_path}/after.json"
        )
        out = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
            cwd=repo, env={**env(), "LEHR_MLFLOW": "0"}, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        returncode = int((tmp_path / "rc").read_text())
        after = json.loads((tmp_path / "after.json").read_text())
    said = out.stdout + out.stderr
    assert returncode != 0 and "Traceback" not in said, said[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"lehr: error: {SAYS[run]}"), said[-3000:]
    cause = "file-size limit (ulimit -f) is reached" if fault == "file-size limit" else "the disk is full"
    assert cause in last and ("as it was before" in last or "is intact" in last), last
    assert {name: after.get(name) for name in before} == before, "an earlier file changed or went"
    new = set(after) - set(before)
    assert not any(".tmp-" in name or ".old-" in name for name in new), new
    if run != "fresh stable run":
        assert not new, new
