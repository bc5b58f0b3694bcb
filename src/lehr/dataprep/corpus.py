"""The raw corpus: a folder of tier folders, streamed file by file, decoded strictly.

Layout (the same for the bundled corpus and for a user's own)::

    <root>/<tier>/...      training text of tier <tier> (gold, silver, bronze, ...)
    <root>/heldout/<src>   held-out text of source <src> (a file or a folder)

Files are ``.txt`` (one document per file), ``.jsonl``, ``.jsonl.gz`` or ``.jsonl.zst`` (one
JSON object per line, the text in ``text_field``) or ``.parquet`` (a ``text_field`` column, read
a batch of rows at a time). Everything is read in sorted path order, so the same folder always
yields the same documents in the same order.

Nothing here holds a file whole: text files and lines are read in pieces, and a document longer
than ``PIECE_CHARS`` is handed on in pieces cut just before a whitespace that starts a word.
Byte-level BPE pre-tokenizes at exactly those places, so the pieces encode to the same tokens as
the whole document would. Memory per document is therefore bounded by ``PIECE_CHARS``, except a
single JSONL line or parquet cell, which is parsed whole (a JSON value cannot be parsed in pieces)
and refused by name past ``MAX_RECORD_BYTES``: a JSONL line before it is read whole, a parquet cell
once Arrow has read it (Arrow reads a cell whole).
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import logging
import os
import re
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lehr import fixes

HELDOUT = "heldout"
SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")
PIECE_CHARS = 1 << 20  # the most characters of one document handed on at once
# The longest JSONL line or parquet cell read: either is parsed whole, so this bounds its memory.
MAX_RECORD_BYTES = 64 << 20
_READ_BYTES = 4 << 20

log = logging.getLogger(__name__)


class CorpusError(ValueError):
    """Bad corpus input; the message names the file and the fix."""


@dataclass(frozen=True)
class Document:
    """A document, or one piece of a long one (``last`` is False on every piece but its last)."""

    stream: str  # "train/<tier>" or "heldout/<source>"
    text: str
    last: bool = True


def suffix_of(path: Path) -> str | None:
    return next((s for s in SUFFIXES if path.name.endswith(s)), None)


def stream_of(root: Path, path: Path) -> str:
    parts = path.relative_to(root).parts
    if len(parts) < 2:
        raise CorpusError(
            f"{path}: corpus files must live in a tier folder (<root>/<tier>/...), "
            f"e.g. {root}/gold/{path.name}"
        )
    if parts[0] == HELDOUT:
        name = parts[1]
        suffix = suffix_of(Path(name))
        return f"{HELDOUT}/{name[: -len(suffix)] if suffix else name}"
    return f"train/{parts[0]}"


# Whitespace as the byte-level pre-tokenizer's regex sees it: Python's isspace() less the four
# information separators U+001C..U+001F, which the regex takes for punctuation (checked over
# every code point).
_NOT_SPACE = "\x1c\x1d\x1e\x1f"
_WORD_START = re.compile(r"[^\S\x1c-\x1f](?=[\S\x1c-\x1f])")  # a run's last space, a non-space next


def _is_space(ch: str) -> bool:
    return ch.isspace() and ch not in _NOT_SPACE


def cut_points(text: str, limit: int | None = None, hard: bool = True) -> Iterator[str]:
    """``text`` in pieces of at most ``limit`` characters, each cut before the last whitespace
    character of a run that a non-space follows, where the BPE pre-tokenizer splits anyway.
    A stretch of ``limit`` characters without such a place is cut hard (the documented longest
    pre-token); with ``hard=False`` the piece runs on to the next such place instead."""
    limit = limit or PIECE_CHARS
    start = 0
    while len(text) - start > limit:
        end = start + limit
        cut = end
        while cut > start + 1 and not (_is_space(text[cut - 1]) and not _is_space(text[cut])):
            cut -= 1
        if cut > start + 1:
            cut -= 1
        elif hard:
            cut = end
        elif found := _WORD_START.search(text, end):
            cut = found.start()
        else:
            break
        yield text[start:cut]
        start = cut
    yield text[start:]


def _utf8_error(path: Path, raw: bytes, start: int, offset: int) -> CorpusError:
    """``raw[start]`` is the bad byte; ``offset`` is where ``raw`` starts in the file."""
    return CorpusError(
        f"{path}: not valid UTF-8 at byte offset {offset + start} "
        f"({raw[start : start + 4]!r}). Re-encode the file as UTF-8, or set "
        f"tokenize.on_decode_error: replace to substitute U+FFFD."
    )


def _decode(raw: bytes, path: Path, errors: str, offset: int = 0) -> str:
    try:
        return raw.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise _utf8_error(path, raw, e.start, offset) from None


def _open(path: Path):
    try:
        return open(path, "rb")
    except PermissionError:
        raise CorpusError(
            f"{path}: cannot be read (permission denied). Fix its permissions "
            f"(chmod a+r) or move it out of the corpus folder."
        ) from None


def _decompressed(path: Path) -> Iterator[bytes]:
    """The file's bytes, decompressed for .gz and .zst, a chunk at a time; truncation raises EOFError."""
    with _open(path) as f:
        if path.name.endswith(".gz"):
            with gzip.GzipFile(fileobj=f) as g:  # raises EOFError on a truncated member
                yield from iter(lambda: g.read(_READ_BYTES), b"")
            return
        if not path.name.endswith(".zst"):
            yield from iter(lambda: f.read(_READ_BYTES), b"")
            return
        import zstandard  # only corpora shipped as .zst need it

        # A decompressobj, not stream_reader: the reader ends quietly at a truncated frame.
        d = zstandard.ZstdDecompressor().decompressobj()
        for raw in iter(lambda: f.read(_READ_BYTES), b""):
            while raw:
                yield d.decompress(raw)
                raw = d.unused_data if d.eof else b""
                if raw:  # the next of several concatenated frames
                    d = zstandard.ZstdDecompressor().decompressobj()
        if not d.eof:
            raise EOFError("the last zstd frame ends early")


def _read_txt(path: Path, errors: str) -> Iterator[tuple[str, bool]]:
    """The file as one document, decoded incrementally, in pieces of at most PIECE_CHARS."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors)
    pending, offset = "", 0
    chunks = _decompressed(path)
    while True:
        raw = next(chunks, b"")
        held = decoder.getstate()[0]  # the unfinished character the last read ended in
        try:
            pending += decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as e:  # e.object is held + raw
            raise _utf8_error(path, e.object, e.start, offset - len(held)) from None
        offset += len(raw)
        if not raw:
            break
        if len(pending) > PIECE_CHARS:
            *pieces, pending = cut_points(pending)
            for piece in pieces:
                yield piece, False
    yield pending, True


def _lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, line) of a possibly compressed file; truncation named."""
    lineno, offset = 0, 0
    held: list[bytes] = []  # the start of a line that spans chunks
    chunks = _decompressed(path)
    while True:
        try:
            chunk = next(chunks, None)
        except (EOFError, OSError, zlib.error) as e:
            raise CorpusError(
                f"{path}: the compressed stream is truncated or corrupt after line {lineno} ({e}). "
                f"Re-download or re-compress the file."
            ) from None
        except Exception as e:  # zstandard.ZstdError, without importing zstandard for every corpus
            if type(e).__name__ != "ZstdError":
                raise
            raise CorpusError(
                f"{path}: the compressed stream is corrupt after line {lineno} ({e}). "
                f"Re-download or re-compress the file."
            ) from None
        if chunk is None:
            break
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            line = b"".join([*held, chunk[start:end]])
            held, start, lineno = [], end + 1, lineno + 1
            if len(line) > MAX_RECORD_BYTES:
                raise _too_long(path, f"line {lineno}", len(line))
            yield lineno, offset, line
            offset += len(line) + 1
        if start < len(chunk):
            held.append(chunk[start:])
            if (size := sum(map(len, held))) > MAX_RECORD_BYTES:
                raise _too_long(path, f"line {lineno + 1}", size)
    if held:
        yield lineno + 1, offset, b"".join(held)


def _too_long(path: Path, where: str, size: int) -> CorpusError:
    return CorpusError(
        f"{path}:{where}: one record of more than {size / 2**20:.0f} MiB; lehr parses a JSONL line or a "
        f"parquet cell whole and reads none over {MAX_RECORD_BYTES >> 20} MiB. Split the text into "
        "several records, or save it as a .txt file, which is read in pieces whatever its size."
    )


def _field(value, path: Path, where: str, field: str, found) -> str:
    if isinstance(value, str):
        if 4 * len(value) > MAX_RECORD_BYTES and len(value.encode("utf-8")) > MAX_RECORD_BYTES:
            raise _too_long(path, where, len(value.encode("utf-8")))
        return value
    kind = "null" if value is None else type(value).__name__
    raise CorpusError(
        f"{path}:{where}: field {field!r} is {kind}, not a string; the fields are: "
        f"{', '.join(found)}. Fix the record, or set tokenize.text_field to the text's field."
    )


def _read_jsonl(path: Path, errors: str, field: str) -> Iterator[str]:
    for lineno, offset, line in _lines(path):
        if lineno == 1 and line.startswith(codecs.BOM_UTF8):
            line, offset = line[len(codecs.BOM_UTF8) :], offset + len(codecs.BOM_UTF8)
        text = _decode(line, path, errors, offset)
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise CorpusError(
                f"{path}:{lineno}: not a JSON object ({e.msg} at column {e.colno}); "
                f"each line must be one JSON object with a {field!r} field"
            ) from None
        if not isinstance(record, dict):
            raise CorpusError(
                f"{path}:{lineno}: a JSON {type(record).__name__}, not an object; "
                f"each line must be one JSON object with a {field!r} field"
            )
        if field not in record:
            raise CorpusError(
                f"{path}:{lineno}: no {field!r} field; the fields are: {', '.join(record) or '(none)'}. "
                f"Set tokenize.text_field to the field that holds the text."
            )
        yield _field(record[field], path, str(lineno), field, record)


def _read_parquet(path: Path, field: str) -> Iterator[str]:
    import pyarrow.parquet as pq  # only users with parquet corpora need it

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:
        raise CorpusError(f"{path}: not a readable parquet file ({e})") from None
    columns = pf.schema_arrow.names
    if field not in columns:
        raise CorpusError(
            f"{path}: no {field!r} column; the columns are: {', '.join(columns)}. "
            f"Set tokenize.text_field to the column that holds the text."
        )
    row = 0  # of the file, counted across row groups and batches
    for group in range(pf.num_row_groups):
        first = row
        for batch in pf.iter_batches(batch_size=1024, row_groups=[group], columns=[field]):
            for value in batch.column(0).to_pylist():
                yield _field(
                    value, path, f"row {row} (row {row - first} of row group {group})", field, columns
                )
                row += 1


def read_file(root: Path, path: Path, errors: str = "strict", field: str = "text") -> Iterator[Document]:
    """Every non-empty document of one corpus file, long ones in pieces."""
    stream = stream_of(root, path)
    if suffix_of(path) == ".txt":
        # Leading blank pieces wait until the document shows text: a blank file is no document.
        held: list[str] = []
        shown = False
        for piece, last in _read_txt(path, errors):
            if not shown and not piece.strip():
                held.append(piece)
                continue
            shown = True
            yield from (Document(stream, h, False) for h in held)
            held = []
            yield Document(stream, piece, last)
        return
    texts = _read_parquet(path, field) if suffix_of(path) == ".parquet" else _read_jsonl(path, errors, field)
    for text in texts:
        if not text.strip():
            continue
        pieces = list(cut_points(text)) if len(text) > PIECE_CHARS else [text]
        for i, piece in enumerate(pieces):
            yield Document(stream, piece, i == len(pieces) - 1)


def not_regular(path: Path) -> str | None:
    """Why ``path`` (a link followed) is no file to read, or None: a FIFO or a device never ends,
    and DVC, which hashes the corpus, would hang on it without a word."""
    mode = path.stat().st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = next((k for test, k in _SPECIAL if test(mode)), "special file")
    via = f" (a symlink to {os.readlink(path)})" if path.is_symlink() else ""
    return (
        f"{path}{via} is a {kind}, not a regular file: lehr reads only regular files, and DVC would hang "
        "hashing it. Move it out of the corpus folder."
    )


_SPECIAL = (
    (stat.S_ISFIFO, "FIFO (named pipe)"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


def special_files(root: Path) -> list[str]:
    """``not_regular``'s line for every such entry under ``root`` (links to folders not followed:
    tokenize, which follows them, names any found there)."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(folder) / name
            if not name.startswith(".") and path.exists() and (why := not_regular(path)):
                found.append(why)
    return found


def _identity(folder: Path) -> tuple[int, int]:
    st = folder.stat()
    return st.st_dev, st.st_ino


def _walk(folder: Path, above: frozenset) -> Iterator[Path]:
    """Every file under ``folder`` in sorted path order, following symlinks (to files and to
    folders), names starting with ``.`` left out. A link that leads back into a folder it sits in
    (a loop) and a link to nothing are skipped, each named in a warning."""
    for p in sorted(folder.iterdir()):
        if p.name.startswith("."):
            continue
        if p.is_symlink() and not p.exists():
            log.warning("skipping %s: a symlink to %s, which does not exist", p, os.readlink(p))
        elif p.is_dir():
            identity = _identity(p)
            if identity in above:
                log.warning(
                    "skipping %s: a symlink loop (it leads back to %s, a folder it sits in)", p, p.resolve()
                )
                continue
            yield from _walk(p, above | {identity})
        elif why := not_regular(p):
            raise CorpusError(why)
        else:
            yield p


class Corpus:
    """A lazy view of a corpus folder: its files in sorted path order, symlinks followed."""

    def __init__(self, root: str | Path, text_field: str = "text"):
        self.root = Path(root)
        self.text_field = text_field

    def files(self) -> list[Path]:
        if not self.root.is_dir():
            raise CorpusError(
                f"corpus folder {self.root} does not exist. Run `{fixes.rebuild('corpus')}` to lay out the "
                f"bundled corpus, or set `corpus` in conf/base/globals.yml to your own folder."
            )
        files = []
        for p in _walk(self.root, frozenset({_identity(self.root)})):
            if suffix_of(p) is None:
                continue
            if p.stat().st_size == 0:
                log.warning("skipping %s: the file is empty", p)
                continue
            files.append(p)
        if not files:
            raise CorpusError(
                f"corpus folder {self.root} holds no .txt, .jsonl(.gz|.zst) or .parquet files. "
                f"Run `{fixes.rebuild('corpus')}`, or add <tier>/ folders of text files."
            )
        return files

    def documents(self, errors: str = "strict") -> Iterator[Document]:
        """Every non-empty document, in sorted file order. ``errors`` is ``strict`` or ``replace``."""
        for path in self.files():
            yield from read_file(self.root, path, errors, self.text_field)

    def fingerprint(self) -> str:
        """sha256 over relative paths and contents: changes exactly when the corpus does."""
        h = hashlib.sha256()
        for path in self.files():
            h.update(str(path.relative_to(self.root)).encode())
            with open(path, "rb") as f:
                file_hash = hashlib.file_digest(f, "sha256")
            h.update(file_hash.digest())
        return h.hexdigest()
