"""Shared fixtures: a small real corpus, its tokenizer and shards, and tiny training configs.

Run lehr's tests with ``make test`` (pytest-xdist: a worker per core and three more, each test file
on one worker) and the benchmarks' checks with ``make bench-check``; ``pytest -m "not slow"``
skips the end-to-end tests.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from lehr.catalog import ShardsDataset, TokenizerDataset, TokenStreamsDataset
from lehr.dataprep.bundled_corpus import build
from lehr.dataprep.corpus import Corpus
from lehr.dataprep.params import ShardParams, TokenizeParams
from lehr.engine.config import TrainConfig
from lehr.engine.model import preset
from lehr.pipelines.shard.nodes import shard_streams
from lehr.pipelines.tokenize.nodes import encode_corpus, train_tokenizer
from tests.e2e import make_repo, sh, stages_run

SMOKE_TOKENIZE = dict(
    vocab_size=512,
    special_tokens=["<|endoftext|>"],
    train_sample_bytes=200_000,
    min_frequency=2,
    batch_size=256,
    max_bytes_per_stream=120_000,
    on_decode_error="error",
    workers=1,
)


def pytest_configure(config):
    """Under pytest-xdist, each worker's torch gets its share of the cores: two workers of two
    threads each on two cores slowed tiny runs several-fold (OpenMP threads spin while they wait).
    The stage commands and torchrun workers a test starts inherit the same share."""
    # Each worker's runs claim shares of the machine from an allocator of their own: under one
    # machine-wide allocator, every test's stage would wait for the others' (lehr.engine.processes.shares).
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    os.environ["LEHR_SHARES_DIR"] = tempfile.mkdtemp(prefix=f"lehr-shares-{worker}-")
    os.environ.pop("LEHR_JOBS", None)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        share = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(share)
        import torch

        torch.set_num_threads(share)


# The files that take longest, longest first (per-file sums of a 2-worker run's durations,
# 2026-12-02; each 1 to 5 minutes), by file name wherever its room's folder puts it (no two test
# files under tests/ share a name): scheduled first, so that no worker ends on one of them while
# the others idle. The tour asks for the session's smoke run only at its end, and the second file
# needs none, so that those workers start working while another builds it. (make test keeps this
# order: pytest-xdist's --no-loadscope-reorder.)
LONGEST = (
    "test_readme_tour.py",
    "test_fsdp.py",
    "test_pipeline_e2e.py",
    "test_muon_fsdp.py",
    "test_user_corpus_e2e.py",
    "test_chaos.py",
    "test_operator_faults.py",
    "test_bad_input.py",
    "test_code_in_the_record.py",
    "test_ladder.py",
    "test_resume.py",
)


def pytest_collection_modifyitems(config, items):
    """The longest files first, then the other end-to-end ones, then the rest; each file's tests
    stay together and in their order (pytest-xdist gives each file to one worker, in this order)."""

    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:
        if item.path.name in LONGEST:
            return LONGEST.index(item.path.name)
        return len(LONGEST) + (item.path not in slow)

    items.sort(key=rank)


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """``build(folder)`` run once per test session and shared by every pytest-xdist worker (each
    worker runs its own session fixtures). Whoever builds holds a lock; the others wait and then
    read it. Every user of it reads only: tests that change one copy it first."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, which every worker's own folder sits in
    dest, done = base / name, base / f"{name}.built"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(dest, ignore_errors=True)  # a worker that failed part way
            build(dest)
            done.touch()
    return dest


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "corpus", build)


@pytest.fixture(scope="session")
def smoke_repo(tmp_path_factory, corpus_dir) -> Path:
    """All five stages by one `dvc repro` (MLflow on) in a throwaway repo, once per session.

    Tests go on to change its workspace (experiments, branches), so the uninterrupted run's
    weights are kept beside it: ``reference/pre_anneal.safetensors`` and
    ``reference/anneal/<branch>.safetensors``, with the whole ``reference/pre_anneal`` folder and
    ``reference/dvc.lock``.
    """

    def run(root: Path) -> None:
        path = make_repo(root / "repo", corpus_dir)
        out = sh(path, "dvc", "repro", extra_env={"LEHR_MLFLOW": "1"})
        stages = ["corpus", "tokenize", "shard", "pretrain_stable", "anneal", "evaluate"]
        assert stages_run(out.stdout) == stages
        reference = root / "reference"
        (reference / "anneal").mkdir(parents=True)
        pre_anneal = path / "data/06_models/pre_anneal"
        shutil.copy2(pre_anneal / "model.safetensors", reference / "pre_anneal.safetensors")
        shutil.copytree(pre_anneal, reference / "pre_anneal")  # every file, to the byte
        shutil.copy2(path / "dvc.lock", reference / "dvc.lock")
        for branch in (path / "data/06_models/anneal").glob("[!.]*"):
            weights = reference / "anneal" / f"{branch.name}.safetensors"
            shutil.copy2(branch / "final/model.safetensors", weights)

    return built_once(tmp_path_factory, "e2e", run) / "repo"


@pytest.fixture(scope="session")
def smoke_shards(tmp_path_factory, corpus_dir) -> Path:
    """Tokenizer + shards of ~120 KB per stream, built with the stage nodes themselves."""

    def run(root: Path) -> None:
        corpus = Corpus(corpus_dir)
        params = TokenizeParams(**SMOKE_TOKENIZE)
        tok = train_tokenizer(corpus, params)
        TokenizerDataset(str(root / "tokenizer.json")).save(tok)
        tokens = TokenStreamsDataset(str(root / "tokens"))
        tokens.save(encode_corpus(corpus, tok, params, root / "tokens" / "parts"))
        ShardsDataset(str(root / "shards")).save(
            shard_streams(tokens.load(), tok, ShardParams(shard_tokens=4096))
        )

    return built_once(tmp_path_factory, "data", run) / "shards"


@pytest.fixture
def tiny_config(smoke_shards, tmp_path):
    """A factory of tiny-model configs (0.13M params, 8 x 64 tokens per step) writing under tmp_path."""

    def make(**overrides) -> TrainConfig:
        base = dict(
            model=preset("tiny", 512),
            shards=str(smoke_shards),
            out_dir=str(tmp_path / "run"),
            seed=0,
            data_seed=1,
            batch_size=8,
            micro_batch=4,
            stable_mix={"gold": 1.0, "silver": 1.0},
            planned_steps=40,
            warmup_steps=5,
            eval_every=10,
            ckpt_every=10,
            log_every=5,
            eval_windows=4,
            sample_tokens=0,
            # Not auto: the golden losses and the tolerances against a reference are fp32's on
            # every CPU; bf16 (auto's pick on CPUs with bf16 instructions) has tests of its own.
            precision="fp32",
            compile=False,  # tests do not pay compile time; the compiled path has its own
        )
        return TrainConfig(**{**base, **overrides})

    return make


@pytest.fixture
def trained(tmp_path_factory):
    """A reference run trained once per session: ``trained(cfg, launch)`` is the run folder of
    ``cfg`` (its out_dir aside) under ``launch``, shared by every test that asks for the same one.
    Read it; a test that resumes or changes a run copies it into its own folder first."""
    from tests.engine.forked import run

    def get(cfg: TrainConfig, launch) -> Path:
        key = {**cfg.to_dict(), "out_dir": None, "launch": dataclasses.asdict(launch)}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return built_once(
            tmp_path_factory,
            f"run-{digest}",
            lambda dest: run(dataclasses.replace(cfg, out_dir=str(dest)), launch),
        )

    return get


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has exited: what a kill -9 leaves in a temporary file's name."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def as_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)
