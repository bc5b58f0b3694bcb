"""tokenize and shard nodes: determinism, dtypes, manifest integrity, parameter validation."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from lehr.corpus import Corpus
from lehr.params import ShardParams, TokenizeParams
from lehr.pipelines.tokenize.nodes import encode_corpus, train_tokenizer
from lehr.sharding import cut_shards
from lehr.tokenization import token_dtype
from tests.conftest import SMOKE_TOKENIZE


def test_tokenize_is_byte_identical_across_runs(corpus_dir):
    params = TokenizeParams(**SMOKE_TOKENIZE)
    a, b = train_tokenizer(Corpus(corpus_dir), params), train_tokenizer(Corpus(corpus_dir), params)
    assert a.to_str() == b.to_str()
    (sa, _), (sb, _) = encode_corpus(Corpus(corpus_dir), a, params), encode_corpus(Corpus(corpus_dir), b, params)
    assert sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa)


def test_streams_end_documents_with_eot_and_count_bytes(corpus_dir):
    params = TokenizeParams(**SMOKE_TOKENIZE)
    tok = train_tokenizer(Corpus(corpus_dir), params)
    streams, stats = encode_corpus(Corpus(corpus_dir), tok, params)
    eot = tok.token_to_id("<|endoftext|>")
    for name, tokens in streams.items():
        assert tokens.dtype == np.uint16
        assert tokens[-1] == eot and (tokens == eot).sum() == stats[name]["n_docs"]
        assert stats[name]["n_tokens"] == len(tokens) and stats[name]["n_bytes"] > len(tokens)


def test_token_dtype_widens_past_uint16():
    assert token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32


def test_manifest_describes_every_shard(smoke_shards):
    manifest = json.loads((smoke_shards / "manifest.json").read_text())
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256((smoke_shards / "tokenizer.json").read_bytes()).hexdigest()
    for name, entry in manifest["streams"].items():
        assert sum(s["n_tokens"] for s in entry["shards"]) == entry["n_tokens"]
        for shard in entry["shards"]:
            data = (smoke_shards / shard["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == shard["sha256"]
            assert len(data) == shard["n_tokens"] * 2
    assert not list(smoke_shards.rglob(".*tmp*"))  # no temporary files left behind


def test_shard_larger_than_data_is_refused():
    streams = {"train/gold": np.arange(100, dtype=np.uint16), "heldout/x": np.arange(10, dtype=np.uint16)}
    stats = {k: {"n_docs": 1, "n_bytes": 1, "n_tokens": len(v)} for k, v in streams.items()}
    with pytest.raises(ValueError, match=r"shard.shard_tokens = 50 is larger than the data: stream heldout/x"):
        cut_shards(streams, stats, 50, {})


@pytest.mark.parametrize("change, message", [
    ({"vocab_size": 200}, "tokenize.vocab_size = 200 is out of range"),
    ({"vocab_size": 2_000_000}, "tokenize.vocab_size = 2000000 is out of range"),
    ({"vocab_size": "big"}, "tokenize.vocab_size = 'big' has the wrong type"),
    ({"on_decode_error": "ignore"}, "tokenize.on_decode_error = 'ignore' has the wrong type"),
    ({"special_tokens": ["<pad>"]}, "must start with <|endoftext|>"),
])
def test_tokenize_params_are_validated(change, message):
    with pytest.raises(ValueError, match=message.replace("|", r"\|").replace("(", r"\(")):
        TokenizeParams(**{**SMOKE_TOKENIZE, **change})


def test_shard_params_are_validated():
    with pytest.raises(ValueError, match="shard.shard_tokens must be positive"):
        ShardParams(shard_tokens=0)
    with pytest.raises(TypeError, match="shard_size"):
        ShardParams(shard_size=10)
