"""tokenize and shard: determinism across workers and slices, streaming, resume, any shard size."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil

import numpy as np
import pytest
from tokenizers import Tokenizer

from lehr.catalog import ShardsDataset, TokenStreamsDataset
from lehr.dataprep.corpus import Corpus, Document, cut_points
from lehr.dataprep.params import ShardParams, TokenizeParams
from lehr.dataprep.token_index import TokenStoreError
from lehr.dataprep.tokenization import token_dtype, training_sample
from lehr.pipelines.shard.nodes import shard_streams
from lehr.pipelines.tokenize.nodes import encode_corpus, train_tokenizer
from tests.conftest import SMOKE_TOKENIZE
from tests.e2e import dir_hash


def _tokenize(corpus_dir, out, **overrides):
    params = TokenizeParams(**{**SMOKE_TOKENIZE, **overrides})
    tok = train_tokenizer(Corpus(corpus_dir), params)
    ds = TokenStreamsDataset(str(out / "tokens"))
    ds.save(encode_corpus(Corpus(corpus_dir), tok, params, out / "tokens" / "parts"))
    return tok, ds


def _shard(tok, ds, out, shard_tokens=4096):
    ShardsDataset(str(out / "shards")).save(
        shard_streams(ds.load(), tok, ShardParams(shard_tokens=shard_tokens))
    )
    return out / "shards"


@pytest.fixture(scope="module")
def uncapped(corpus_dir, tmp_path_factory):
    """The bundled corpus' held-out sources plus 40 speeches: many files, no per-stream cap."""
    root = tmp_path_factory.mktemp("uncapped") / "corpus"
    shutil.copytree(corpus_dir / "heldout", root / "heldout")
    (root / "silver").mkdir(parents=True)
    for f in sorted((corpus_dir / "silver" / "sotu").iterdir())[:40]:
        shutil.copy2(f, root / "silver" / f.name)
    return root


def test_same_bytes_for_any_number_of_workers_and_slices(uncapped, tmp_path):
    kw = dict(max_bytes_per_stream=0)
    tok, one = _tokenize(uncapped, tmp_path / "w1", workers=1, **kw)
    reference = dir_hash(_shard(tok, one, tmp_path / "w1"))
    tok2, two = _tokenize(uncapped, tmp_path / "w2", workers=2, **kw)
    assert tok2.to_str() == tok.to_str()
    assert dir_hash(_shard(tok2, two, tmp_path / "w2")) == reference
    # Three machines, one slice each, sharing one output folder; shard merges them.
    shared = tmp_path / "sliced"
    for i in (2, 3, 1):
        _tokenize(uncapped, shared, workers=1, slice=f"{i}/3", **kw)
    assert sorted(p.name for p in (shared / "tokens").glob("streams*.json")) == [
        "streams-1-of-3.json",
        "streams-2-of-3.json",
        "streams-3-of-3.json",
    ]
    assert dir_hash(_shard(tok, TokenStreamsDataset(str(shared / "tokens")), shared)) == reference


def test_missing_slice_is_named(uncapped, tmp_path):
    _tokenize(uncapped, tmp_path, workers=1, max_bytes_per_stream=0, slice="1/2")
    with pytest.raises(Exception, match=r"slice\(s\) 2/2 of the tokenize run are not finished"):
        TokenStreamsDataset(str(tmp_path / "tokens")).load()


def test_streams_end_documents_with_eot_and_count_bytes(corpus_dir, tmp_path):
    tok, ds = _tokenize(corpus_dir, tmp_path)
    streams, eot = ds.load(), tok.token_to_id("<|endoftext|>")
    for name in streams.streams:
        tokens = np.concatenate(list(streams.chunks(name, tokens=1000)))
        stats = streams.stats(name)
        assert tokens.dtype == np.uint16
        assert tokens[-1] == eot and (tokens == eot).sum() == stats["n_docs"]
        assert stats["n_tokens"] == len(tokens) and stats["n_bytes"] > len(tokens)


def test_a_rerun_reuses_finished_parts_and_drops_stale_ones(uncapped, tmp_path):
    _tokenize(uncapped, tmp_path, workers=1, max_bytes_per_stream=0)
    parts = tmp_path / "tokens" / "parts"
    before = {p.name: p.stat().st_mtime_ns for p in parts.glob("*.bin")}
    index = json.loads((tmp_path / "tokens" / "streams.json").read_text())
    victim = sorted((uncapped / "silver").iterdir())[0]
    moved = tmp_path / victim.name
    shutil.move(victim, moved)  # the corpus loses a file: its part goes, the others are reused
    try:
        _tokenize(uncapped, tmp_path, workers=1, max_bytes_per_stream=0)
    finally:
        shutil.move(moved, victim)
    after = {p.name: p.stat().st_mtime_ns for p in parts.glob("*.bin")}
    assert len(after) == len(before) - 1 and all(before[n] == t for n, t in after.items())
    # The file back, and another touched (a corpus laid out again): the one returned is encoded
    # again under its old name and bytes; the touched one holds the same bytes, so it is reused.
    touched = sorted((uncapped / "silver").iterdir())[1]
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    _tokenize(uncapped, tmp_path, workers=1, max_bytes_per_stream=0)
    again = {p.name: p.stat().st_mtime_ns for p in parts.glob("*.bin")}
    assert again.keys() == before.keys() and sum(again[n] != before[n] for n in again) == 1
    assert json.loads((tmp_path / "tokens" / "streams.json").read_text()) == index


def test_pieces_of_a_long_document_encode_like_the_whole(corpus_dir, tmp_path):
    tok = Tokenizer.from_str(_tokenize(corpus_dir, tmp_path)[0].to_str())
    rng = random.Random(0)
    # U+001C..U+001F are whitespace to Python and punctuation to the pre-tokenizer's regex.
    words = ["the", "a", "Haus", "42", "x" * 30, "\n\n", "  ", "\t", "é", "end.", ".\x1c", "\x1f", "\xa0"]
    seps = [" ", "  ", "\n", " \n ", "", "\x1c", "\u2003", "\xa0"]
    text = "".join(rng.choice(words) + rng.choice(seps) for _ in range(20_000))
    whole = tok.encode(text, add_special_tokens=False).ids
    for hard in (True, False):
        pieces = list(cut_points(text, limit=997, hard=hard))
        assert "".join(pieces) == text and len(pieces) > 50 and max(map(len, pieces)) <= 997
        assert [i for p in pieces for i in tok.encode(p, add_special_tokens=False).ids] == whole
    # A stretch longer than the limit with nowhere to cut: without hard cuts the piece runs on to
    # the next place, and the tokens stay the whole text's.
    text = text[:5000] + "a,b;" * 700 + text[5000:]
    pieces = list(cut_points(text, limit=997, hard=False))
    assert "".join(pieces) == text and max(map(len, pieces)) > 2800
    whole = tok.encode(text, add_special_tokens=False).ids
    assert [i for p in pieces for i in tok.encode(p, add_special_tokens=False).ids] == whole


def test_documents_and_long_lines_encode_to_the_tokens_of_each_whole_document(
    corpus_dir, tmp_path, monkeypatch
):
    """Encoding in batches bounded by characters, and in parts of a long piece, changes no token: on
    the bundled corpus, and on its text as one line with no newline, read in pieces."""
    from lehr.dataprep import corpus, tokenization

    tok = Tokenizer.from_str(_tokenize(corpus_dir, tmp_path)[0].to_str())
    eot = tok.token_to_id("<|endoftext|>")
    docs = list(Corpus(corpus_dir).documents())
    whole = [e.ids + [eot] for e in tok.encode_batch_fast([d.text for d in docs], add_special_tokens=False)]
    monkeypatch.setattr(tokenization, "ENCODE_CHARS", 997)
    monkeypatch.setattr(tokenization, "BATCH_CHARS", 20_000)
    assert [ids.tolist() for _, ids in tokenization.encode_documents(tok, iter(docs), 256)] == whole
    one_line = " ".join(d.text.replace("\n", " ") for d in docs)[:2_000_000]
    (tmp_path / "line" / "gold").mkdir(parents=True)
    (tmp_path / "line" / "gold" / "one.txt").write_text(one_line)
    monkeypatch.setattr(corpus, "PIECE_CHARS", 50_000)
    pieces = list(Corpus(tmp_path / "line").documents())
    assert len(pieces) > 30 and [p.last for p in pieces].count(True) == 1  # one document: the file
    encoded = [i for _, ids in tokenization.encode_documents(tok, iter(pieces), 256) for i in ids.tolist()]
    assert encoded == tok.encode(one_line, add_special_tokens=False).ids + [eot]


def test_a_stream_cap_ends_a_long_document_at_the_piece_that_reaches_it():
    from lehr.dataprep.token_writer import _capped

    long = [Document("train/a", "x" * 10, last=False) for _ in range(9)] + [Document("train/a", "end")]
    short = [Document("train/a", "a whole document")]
    kept = list(_capped(iter(short + long + short), cap=40))
    assert [d.text for d in kept] == ["a whole document", "x" * 10, "x" * 10, "x" * 10]
    assert [d.last for d in kept] == [True, False, False, True]  # the long one ends at the cap
    assert list(_capped(iter(short + short), cap=1)) == short  # a whole document passes the cap


def test_streamed_bpe_sample_equals_the_sorted_prefix():
    rng = random.Random(1)
    docs = [
        Document(rng.choice(["train/a", "train/b", "heldout/x"]), "w" * rng.randint(1, 300) + str(i))
        for i in range(2000)
    ]
    for budget in (0, 1, 5_000, 77_777, 10**9):
        train = sorted(
            (d.text for d in docs if d.stream.startswith("train/")),
            key=lambda t: hashlib.sha256(t.encode()).digest(),
        )
        expected, used = [], 0
        for t in train:
            if budget and used >= budget:
                break
            expected.append(t)
            used += len(t.encode())
        assert training_sample(iter(docs), budget) == expected


def test_a_word_of_megabytes_does_not_stall_bpe_training(tmp_path):
    root = tmp_path / "c"
    (root / "gold").mkdir(parents=True)
    (root / "gold" / "blob.jsonl").write_text(
        json.dumps({"text": "ab" * 1_500_000})
        + "\n"
        + json.dumps({"text": "a normal document. " * 50})
        + "\n"
    )
    params = TokenizeParams(**{**SMOKE_TOKENIZE, "vocab_size": 300, "max_bytes_per_stream": 0})
    tok = train_tokenizer(Corpus(root), params)  # took minutes before words were capped for BPE
    ds = TokenStreamsDataset(str(tmp_path / "tokens"))
    ds.save(encode_corpus(Corpus(root), tok, params, tmp_path / "tokens" / "parts"))
    assert ds.load().stats("train/gold")["n_docs"] == 2


def test_token_dtype_widens_past_uint16():
    assert token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32


def test_manifest_describes_every_shard(smoke_shards):
    manifest = json.loads((smoke_shards / "manifest.json").read_text())
    assert (
        manifest["tokenizer"]["sha256"]
        == hashlib.sha256((smoke_shards / "tokenizer.json").read_bytes()).hexdigest()
    )
    for _name, entry in manifest["streams"].items():
        assert sum(s["n_tokens"] for s in entry["shards"]) == entry["n_tokens"]
        for shard in entry["shards"]:
            data = (smoke_shards / shard["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == shard["sha256"]
            assert len(data) == shard["n_tokens"] * 2
    assert not list(smoke_shards.parent.glob(".*tmp*"))  # no temporary files left behind


def test_shards_larger_than_a_stream_give_one_short_shard(corpus_dir, tmp_path):
    tok, ds = _tokenize(corpus_dir, tmp_path)
    sizes = sorted(ds.load().stats(n)["n_tokens"] for n in ds.load().streams)
    size = (
        sizes[0] + sizes[-1]
    ) // 2  # longer than the smallest stream (refused before), shorter than the largest
    manifest = json.loads((_shard(tok, ds, tmp_path, shard_tokens=size) / "manifest.json").read_text())
    counts = []
    for name, entry in manifest["streams"].items():
        lengths = [s["n_tokens"] for s in entry["shards"]]
        assert all(n == size for n in lengths[:-1]) and 0 < lengths[-1] <= size, (name, lengths)
        counts.append(len(lengths))
    assert min(counts) == 1 and max(counts) >= 2


def test_shard_refuses_a_tokenizer_that_did_not_make_the_tokens(corpus_dir, tmp_path):
    tok, ds = _tokenize(corpus_dir, tmp_path)
    other, _ = _tokenize(corpus_dir, tmp_path / "other", vocab_size=600)
    with pytest.raises(TokenStoreError, match="is not the one that encoded the token streams"):
        shard_streams(ds.load(), other, ShardParams(shard_tokens=4096))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"vocab_size": 200}, "tokenize.vocab_size = 200 is out of range"),
        ({"vocab_size": 2_000_000}, "tokenize.vocab_size = 2000000 is out of range"),
        ({"vocab_size": "big"}, "tokenize.vocab_size = 'big' has the wrong type"),
        ({"on_decode_error": "ignore"}, "tokenize.on_decode_error = 'ignore' must be one of error, replace"),
        ({"special_tokens": ["<pad>"]}, "must start with <|endoftext|>"),
        ({"workers": -1}, "tokenize.workers = -1 must be >= 0"),
        ({"slice": "3/2"}, "tokenize.slice = '3/2' must be i/N"),
    ],
)
def test_tokenize_params_are_validated(change, message):
    with pytest.raises(ValueError, match=message.replace("|", r"\|").replace("(", r"\(")):
        TokenizeParams(**{**SMOKE_TOKENIZE, **change})


def test_shard_params_are_validated():
    with pytest.raises(ValueError, match="shard.shard_tokens = 0 must be positive"):
        ShardParams(shard_tokens=0)
    with pytest.raises(ValueError, match="unknown parameter shard.shard_size"):
        ShardParams(shard_size=10)
