"""The raw corpus: a folder of tier folders, read lazily, decoded strictly.

Layout (the same for the bundled corpus and for a user's own)::

    <root>/<tier>/...      training text of tier <tier> (gold, silver, bronze, ...)
    <root>/heldout/<src>   held-out text of source <src> (a file or a folder)

Files are ``.txt`` (one document per file), ``.jsonl`` (one JSON object per line with a
``text`` field) or ``.parquet`` (a ``text`` column). Everything is read in sorted path order,
so the same folder always yields the same documents in the same order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HELDOUT = "heldout"
SUFFIXES = (".txt", ".jsonl", ".parquet")


class CorpusError(ValueError):
    """Bad corpus input; the message names the file and the fix."""


@dataclass(frozen=True)
class Document:
    stream: str  # "train/<tier>" or "heldout/<source>"
    text: str


def stream_of(root: Path, path: Path) -> str:
    parts = path.relative_to(root).parts
    if len(parts) < 2:
        raise CorpusError(
            f"{path}: corpus files must live in a tier folder (<root>/<tier>/...), "
            f"e.g. {root}/gold/{path.name}"
        )
    if parts[0] == HELDOUT:
        return f"{HELDOUT}/{Path(parts[1]).stem}"
    return f"train/{parts[0]}"


def _decode(raw: bytes, path: Path, errors: str, offset: int = 0) -> str:
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise CorpusError(
            f"{path}: not valid UTF-8 at byte offset {offset + e.start} "
            f"({raw[e.start:e.start + 4]!r}). Re-encode the file as UTF-8, or set "
            f"tokenize.on_decode_error: replace to substitute U+FFFD."
        ) from None


def _read_file(path: Path, errors: str) -> Iterator[str]:
    if path.suffix == ".txt":
        yield _decode(path.read_bytes(), path, errors)
    elif path.suffix == ".jsonl":
        offset = 0
        for lineno, line in enumerate(path.read_bytes().splitlines(keepends=True), 1):
            text = _decode(line, path, errors, offset)
            offset += len(line)
            if not text.strip():
                continue
            try:
                yield json.loads(text)["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise CorpusError(
                    f"{path}:{lineno}: each line must be a JSON object with a 'text' field"
                ) from None
    else:  # .parquet; imported here because only users with parquet corpora need it
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=["text"])
        yield from (t for t in table.column("text").to_pylist() if t)


class Corpus:
    """A lazy view of a corpus folder."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def files(self) -> list[Path]:
        if not self.root.is_dir():
            raise CorpusError(
                f"corpus folder {self.root} does not exist. Run `make corpus` to fetch the "
                f"bundled corpus, or point the `corpus` catalog entry at your own folder."
            )
        files = sorted(p for p in self.root.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        if not files:
            raise CorpusError(
                f"corpus folder {self.root} holds no .txt, .jsonl or .parquet files. "
                f"Run `make corpus`, or add <tier>/ folders of text files."
            )
        return files

    def documents(self, errors: str = "strict") -> Iterator[Document]:
        """Every non-empty document, in sorted file order. ``errors`` is ``strict`` or ``replace``."""
        for path in self.files():
            stream = stream_of(self.root, path)
            for text in _read_file(path, errors):
                if text.strip():
                    yield Document(stream, text)

    def fingerprint(self) -> str:
        """sha256 over relative paths and contents: changes exactly when the corpus does."""
        h = hashlib.sha256()
        for path in self.files():
            h.update(str(path.relative_to(self.root)).encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
        return h.hexdigest()


def capped(docs: Iterator[Document], max_bytes_per_stream: int) -> Iterator[Document]:
    """The first documents of each stream up to ``max_bytes_per_stream`` (0 = everything)."""
    used: dict[str, int] = {}
    for doc in docs:
        if max_bytes_per_stream and used.get(doc.stream, 0) >= max_bytes_per_stream:
            continue
        used[doc.stream] = used.get(doc.stream, 0) + len(doc.text.encode("utf-8"))
        yield doc
