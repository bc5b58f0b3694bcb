"""Every command a lehr message suggests (``lehr.fixes``) that the smoke sandbox can run, run on the
case that prints it: the message is taken as a person reads it, its command run as written, and the
broken artifact must be whole again. `dvc checkout` without ``-f`` once failed here ("Can't remove
… without confirmation")."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from lehr import fixes
from tests.e2e import dir_hash, sh

pytestmark = pytest.mark.integration
PRE_ANNEAL = "data/06_models/pre_anneal"
BY_HAND = "anneal --params anneal.branch=by-hand"  # a branch by hand: DVC's own may not be run by kedro
SHARDS = "data/04_feature/shards"


def _truncate(path: str) -> Callable[[Path], None]:
    def cut(repo: Path) -> None:
        target = repo / path
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])

    return cut


def _remove(path: str) -> Callable[[Path], None]:
    def remove(repo: Path) -> None:
        target = repo / path
        shutil.rmtree(target) if target.is_dir() else target.unlink()

    return remove


def _write(path: str, text: str) -> Callable[[Path], None]:
    return lambda repo: (repo / path).write_text(text)


def _first_shard(repo: Path) -> str:
    return str(next(p for p in sorted((repo / SHARDS).rglob("*.bin"))).relative_to(repo))


# (what breaks, the command that then fails, the fix its message must suggest, what must be whole)
CASES = {
    "a truncated pre_anneal": (
        _truncate(f"{PRE_ANNEAL}/model.safetensors"), BY_HAND, fixes.restore(PRE_ANNEAL), PRE_ANNEAL,
    ),
    "pre_anneal's state.json corrupt": (
        _write(f"{PRE_ANNEAL}/state.json", "{not json"), BY_HAND, fixes.restore(PRE_ANNEAL),
        PRE_ANNEAL,
    ),
    "pre_anneal gone": (_remove(PRE_ANNEAL), BY_HAND, fixes.rebuild("pretrain_stable"), PRE_ANNEAL),
    "a shard corrupt": (
        lambda repo: _truncate(_first_shard(repo))(repo), "pretrain_stable", fixes.restore(SHARDS), SHARDS,
    ),
    "the shard manifest corrupt": (
        _write(f"{SHARDS}/manifest.json", "{not json"), "pretrain_stable", fixes.force_rebuild("shard"),
        SHARDS,
    ),
    "the shard manifest gone": (
        _remove(f"{SHARDS}/manifest.json"), "pretrain_stable", fixes.rebuild("shard"), SHARDS,
    ),
    "the tokenizer gone": (
        _remove("data/02_intermediate/tokenizer.json"), "shard", fixes.rebuild("tokenize"),
        "data/02_intermediate",
    ),
    "the corpus gone": (_remove("data/01_raw/bundled"), "tokenize", fixes.rebuild("corpus"), "data/01_raw"),
}  # fmt: skip


@pytest.fixture
def repo(tmp_path, smoke_repo):
    path = tmp_path / "repo"  # each case its own copy: one that fails leaves the others whole
    shutil.copytree(smoke_repo, path, symlinks=True)
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_the_command_a_message_suggests_repairs_what_it_names(repo, case):
    breaks, stage, fix, whole = CASES[case]
    before = dir_hash(repo / whole)
    breaks(repo)
    kedro = ["kedro", "run", "--env", "smoke", "--pipelines", *stage.split()]
    out = sh(repo, *kedro, check=False, extra_env={"LEHR_MLFLOW": "0"})
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    said = out.stderr.strip().splitlines()[-1]
    assert said.startswith("lehr: error: "), out.stderr[-3000:]
    suggested = re.findall(r"`([^`]+)`", said)
    assert fix in suggested, f"{said!r} does not suggest `{fix}`"
    sh(repo, "sh", "-c", fix, extra_env={"LEHR_MLFLOW": "0"}, timeout=900)  # as a person types it
    assert dir_hash(repo / whole) == before
    status = sh(repo, "dvc", "status", "--quiet", check=False)
    assert status.returncode == 0, sh(repo, "dvc", "status").stdout  # DVC finds everything as it made it
