"""Bad input at every stage: a non-zero exit, a message that names the problem and the fix, and
no earlier artifact changed. docs/reliability.md's bad-input table lists the same cases."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lehr.engine.artifacts.state import State
from tests.e2e import dir_hash, sh

pytestmark = pytest.mark.slow

GUARDED = ("data/02_intermediate", "data/03_primary", "data/04_feature", "data/06_models")


@pytest.fixture(scope="module")
def repo(tmp_path_factory, smoke_repo):
    """A copy of the session's finished smoke run: every stage's artifacts to guard."""
    path = tmp_path_factory.mktemp("bad") / "repo"
    shutil.copytree(smoke_repo, path, symlinks=True)
    return path


def snapshot(repo):
    return {d: dir_hash(repo / d) for d in GUARDED if (repo / d).exists()}


def kedro(repo, pipeline, *params):
    args = ["kedro", "run", "--pipelines", pipeline, "--env", "smoke"]
    if params:
        args += ["--params", ",".join(params)]
    return sh(repo, *args, check=False)


CASES = [
    ("unknown param key", "tokenize", ["tokenize.vocab_sise=300"], "vocab_sise"),
    (
        "wrong param type",
        "tokenize",
        ["tokenize.vocab_size=big"],
        "tokenize.vocab_size = 'big' has the wrong type",
    ),
    (
        "vocab size out of range",
        "tokenize",
        ["tokenize.vocab_size=100"],
        "tokenize.vocab_size = 100 is out of range",
    ),
    ("zero learning rate", "pretrain_stable", ["pretrain.lr=0.0"], "pretrain.lr = 0.0 must be positive"),
    (
        "negative learning rate",
        "pretrain_stable",
        ["pretrain.lr=-0.001"],
        "pretrain.lr = -0.001 must be positive",
    ),
    (
        "vocab mismatch",
        "pretrain_stable",
        ["pretrain.model.vocab_size=1000"],
        "vocab mismatch: pretrain.model.vocab_size = 1000",
    ),
    (
        "sequence longer than a shard",
        "pretrain_stable",
        # The smoke profile's branch point is whole steps of its own context only: with this one
        # it would be refused first, for that reason.
        ["pretrain.model.overrides.seq_len=9000", "pretrain.branch_points=[]"],
        "model.seq_len = 9000 is longer than every shard",
    ),
    ("more processes than devices", "pretrain_stable", ["pretrain.launch.nproc_per_node=512"], "exceeds the"),
    ("config drift on resume", "pretrain_stable", ["pretrain.weight_decay=0.3"], "weight_decay differ"),
    ("unknown anneal branch", "evaluate", ["evaluate.branches=[nope]"], "unknown anneal branch(es) nope"),
]


@pytest.mark.parametrize("name, pipeline, params, message", CASES, ids=[c[0] for c in CASES])
def test_bad_param_is_refused_and_nothing_changes(repo, name, pipeline, params, message):
    before = snapshot(repo)
    if name == "config drift on resume":  # the smoke run's own stable run, asked to go on changed
        run = Path(State.read(repo / "data/06_models/pre_anneal").out_dir).name
        params = [*params, f"pretrain.run_name={run}"]
    out = kedro(repo, pipeline, *params)
    assert out.returncode != 0, out.stderr[-2000:]
    assert message in out.stderr, out.stderr[-3000:]
    assert snapshot(repo) == before


def test_empty_corpus(repo, tmp_path):
    before = snapshot(repo)
    moved = tmp_path / "corpus"
    shutil.move(repo / "data/01_raw/bundled", moved)
    (repo / "data/01_raw/bundled/gold").mkdir(parents=True)
    try:
        out = kedro(repo, "tokenize")
    finally:
        shutil.rmtree(repo / "data/01_raw/bundled")
        shutil.move(moved, repo / "data/01_raw/bundled")
    assert out.returncode != 0 and "holds no .txt, .jsonl(.gz|.zst) or .parquet files" in out.stderr
    assert snapshot(repo) == before


def test_non_utf8_file(repo):
    before = snapshot(repo)
    bad = repo / "data/01_raw/bundled/gold/broken.txt"
    bad.write_bytes(b"caf\xe9 au lait")
    try:
        out = kedro(repo, "tokenize")
    finally:
        bad.unlink()
    assert out.returncode != 0
    assert "broken.txt: not valid UTF-8 at byte offset 3" in out.stderr
    assert snapshot(repo) == before


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("zz.jsonl", b'{"body": "no text here"}\n', "zz.jsonl:1: no 'text' field; the fields are: body"),
        (
            "zz.jsonl.gz",
            b"\x1f\x8b\x08\x00broken",
            "zz.jsonl.gz: the compressed stream is truncated or corrupt",
        ),
    ],
)
def test_bad_corpus_file(repo, name, data, message):
    before = snapshot(repo)
    bad = repo / "data/01_raw/bundled/gold" / name
    bad.write_bytes(data)
    try:
        out = kedro(repo, "tokenize")
    finally:
        bad.unlink()
    assert out.returncode != 0 and message in out.stderr, out.stderr[-2000:]
    assert snapshot(repo) == before


def test_corrupted_manifest(repo):
    manifest = repo / "data/04_feature/shards/manifest.json"
    good = manifest.read_bytes()
    before = snapshot(repo)
    manifest.write_bytes(good[: len(good) // 2])
    try:
        out = kedro(repo, "pretrain_stable")
    finally:
        manifest.write_bytes(good)
    assert out.returncode != 0 and "manifest.json is corrupt" in out.stderr
    assert snapshot(repo) == before


def test_missing_tokenizer(repo, tmp_path):
    tok = repo / "data/02_intermediate/tokenizer.json"
    before = snapshot(repo)
    shutil.move(tok, tmp_path / "tokenizer.json")
    try:
        out = kedro(repo, "shard")
    finally:
        shutil.move(tmp_path / "tokenizer.json", tok)
    assert out.returncode != 0 and "tokenizer.json is missing: run the tokenize stage first" in out.stderr
    assert snapshot(repo) == before


def test_anneal_without_pre_anneal(repo, tmp_path):
    pre = repo / "data/06_models/pre_anneal"
    before = snapshot(repo)
    shutil.move(pre, tmp_path / "pre_anneal")
    try:
        out = kedro(repo, "anneal")
    finally:
        shutil.move(tmp_path / "pre_anneal", pre)
    assert out.returncode != 0
    assert "pre_anneal does not exist: run pretrain_stable first" in out.stderr
    assert snapshot(repo) == before
