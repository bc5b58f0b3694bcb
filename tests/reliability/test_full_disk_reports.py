"""A full disk while `evaluate` writes its reports, for real (a file-size limit, nothing patched):
the stage says so in one line, and every report is either the previous one, byte for byte, or a
whole new one; no cut file, no leftover."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.e2e import env

pytestmark = pytest.mark.slow


def test_a_full_disk_during_evaluate_leaves_every_report_whole(smoke_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(smoke_repo, repo, symlinks=True)
    reports = repo / "data/08_reporting"
    before = {p.name: p.read_bytes() for p in reports.iterdir() if p.is_file()}
    assert len(before["metrics.json"]) > 3000  # the limit below cuts it
    out = subprocess.run(
        ["prlimit", "--fsize=3000", "kedro", "run", "--pipelines", "evaluate"],
        cwd=repo,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("lehr: error: no room writing data/08_reporting/"), out.stderr[-3000:]
    assert "ulimit -f" in last and "as it was before" in last
    assert "Traceback" not in out.stderr
    after = {p.name: p.read_bytes() for p in reports.iterdir() if p.is_file()}
    assert after["metrics.json"] == before["metrics.json"]
    assert set(after) == set(before), "a leftover or a lost report"
    for name, data in after.items():  # each one whole: the old one, or a complete new one
        if name.endswith(".json"):
            json.loads(data)
