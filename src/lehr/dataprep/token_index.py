"""Token streams on disk: the layout and index that the writer (``token_writer``) makes and the
reader (``token_reader``) merges.

Layout of the tokenize stage's output folder::

    parts/<key>.bin             the tokens of one task (a corpus file; or, under a per-stream
                                cap, all files of a stream), appended as they are encoded
    parts/.<key>.resume         that part's record, written after its .bin is complete, with the
                                sha256 of each file it encoded and of the .bin (DVC ignores it)
    streams.json                the index of a whole run
    streams-<i>-of-<N>.json     the index of slice i of N (``tokenize.slice``), for runs split
                                across machines; the shard stage merges the N of them

A part's key hashes what makes its bytes (the tokenizer, the stream, the files' paths, the
reading settings); its record adds the sha256 of every file it read, so a rerun after a kill
reuses every finished part whose files hold the same bytes and encodes only the rest (a file's
size and time prove nothing: ``cp -p``, ``rsync -a`` and ``tar x`` keep them over new content).
Each index records the plan it was cut from (every task's files, the tokenizer, the settings),
and slices are merged only when their plans agree. Names and
bytes depend on the task alone, never on the number of workers or slices or on when the corpus
was laid out, so every split of the work gives the same folder, and DVC the same hash.
"""

from __future__ import annotations

import re

FORMAT = 2


class TokenStoreError(ValueError):
    """Token streams that cannot be used; the message names the file and the fix."""


RESUME = ".resume"  # suffix of a part's record (``.<key>.resume``), which .dvcignore names


def parse_slice(spec: str) -> tuple[int, int]:
    """``"i/N"`` (1-based) -> (i, N)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise ValueError(f"parameter tokenize.slice = {spec!r} must be i/N with 1 <= i <= N, e.g. 1/1 or 2/4")
    return int(m[1]), int(m[2])


def index_name(index: dict) -> str:
    i, n = index["slice"]
    return "streams.json" if n == 1 else f"streams-{i}-of-{n}.json"


COUNTS = ("n_docs", "n_bytes", "n_tokens")


def add_to_stream(streams: dict[str, dict], name: str, counts: dict, parts: list[dict]) -> None:
    """Count ``counts`` and ``parts`` into stream ``name`` of an index: a part's record into its
    slice's index as it is written, and a slice's stream into the merged one as it is read."""
    stream = streams.setdefault(name, {**dict.fromkeys(COUNTS, 0), "parts": []})
    for k in COUNTS:
        stream[k] += counts[k]
    stream["parts"].extend(parts)
