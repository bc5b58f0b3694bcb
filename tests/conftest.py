"""Shared fixtures: a small real corpus, its tokenizer and shards, and tiny training configs.

Run everything with ``make test``; ``pytest -m "not slow"`` skips the end-to-end tests.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lehr.data.bundled_corpus import build
from lehr.data.corpus import Corpus
from lehr.data.params import ShardParams, TokenizeParams
from lehr.datasets import ShardsDataset, TokenizerDataset, TokenStreamsDataset
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


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus") / "corpus"
    build(out)
    return out


@pytest.fixture(scope="session")
def smoke_repo(tmp_path_factory, corpus_dir) -> Path:
    """All five stages by one `dvc repro` (MLflow on) in a throwaway repo, once per session.

    Tests go on to change its workspace (experiments, branches), so the uninterrupted run's
    weights are kept beside it: ``reference/pre_anneal.safetensors`` and
    ``reference/anneal/<branch>.safetensors``, with the whole ``reference/pre_anneal`` folder and
    ``reference/dvc.lock``.
    """
    path = make_repo(tmp_path_factory.mktemp("e2e") / "repo", corpus_dir)
    out = sh(path, "dvc", "repro", extra_env={"LEHR_MLFLOW": "1"})
    assert stages_run(out.stdout) == ["corpus", "tokenize", "shard", "pretrain_stable", "anneal", "evaluate"]
    reference = path.parent / "reference"
    (reference / "anneal").mkdir(parents=True)
    shutil.copy2(path / "data/06_models/pre_anneal/model.safetensors", reference / "pre_anneal.safetensors")
    shutil.copytree(path / "data/06_models/pre_anneal", reference / "pre_anneal")  # every file, to the byte
    shutil.copy2(path / "dvc.lock", reference / "dvc.lock")
    for branch in (path / "data/06_models/anneal").glob("[!.]*"):
        shutil.copy2(branch / "final/model.safetensors", reference / "anneal" / f"{branch.name}.safetensors")
    return path


@pytest.fixture(scope="session")
def smoke_shards(tmp_path_factory, corpus_dir) -> Path:
    """Tokenizer + shards of ~120 KB per stream, built with the stage nodes themselves."""
    root = tmp_path_factory.mktemp("data")
    corpus = Corpus(corpus_dir)
    params = TokenizeParams(**SMOKE_TOKENIZE)
    tok = train_tokenizer(corpus, params)
    TokenizerDataset(str(root / "tokenizer.json")).save(tok)
    tokens = TokenStreamsDataset(str(root / "tokens"))
    tokens.save(encode_corpus(corpus, tok, params, root / "tokens" / "parts"))
    ShardsDataset(str(root / "shards")).save(
        shard_streams(tokens.load(), tok, ShardParams(shard_tokens=4096))
    )
    return root / "shards"


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
        )
        return TrainConfig(**{**base, **overrides})

    return make


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has exited: what a kill -9 leaves in a temporary file's name."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def as_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)
