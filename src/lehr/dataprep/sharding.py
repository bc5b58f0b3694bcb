"""Cut token streams into shards of a fixed size and describe them in a manifest.

Manifest (``manifest.json``, format 1)::

    {"format": 1, "dtype": "uint16", "shard_tokens": N,
     "tokenizer": {"sha256": ..., "vocab_size": ..., "eot_id": ...},
     "streams": {"train/gold": {"split": "train", "n_docs", "n_bytes", "n_tokens",
                                "shards": [{"file": "train/gold/000000.bin", "n_tokens", "sha256"}]}}}

Shard files are raw little-endian arrays of ``dtype`` that the training loop ``np.memmap``s. Each
stream is cut into full shards and one shorter last shard, whatever the sizes of its streams.
The tokens are read from the token parts a bounded chunk at a time (plain reads, not memory maps,
whose touched pages would count against the process), so memory grows neither with the corpus
nor with ``shard_tokens``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from tqdm.auto import tqdm

from lehr import versions
from lehr.files.atomic import staged_dir, write_text_atomic

MANIFEST_FORMAT = 1


Chunks = Callable[[], Iterator[np.ndarray]]  # a stream's tokens in order, a bounded chunk at a time


def _write_stream(folder: Path, name: str, chunks: Chunks, shard_tokens: int, bar: tqdm) -> list[dict]:
    """The stream's shards under ``folder/name``; returns their manifest entries."""
    entries: list[dict] = []
    (folder / name).mkdir(parents=True, exist_ok=True)
    f: BinaryIO | None = None
    h, n = hashlib.sha256(), 0

    def close() -> None:
        assert f is not None  # called with a shard open
        f.flush()
        os.fsync(f.fileno())
        f.close()
        entries.append({"file": f"{name}/{len(entries):06d}.bin", "n_tokens": n, "sha256": h.hexdigest()})

    for chunk in chunks():
        bar.update(len(chunk))
        while len(chunk):
            if f is None:
                # Open across chunks until the shard is full, then closed by close(): no `with` spans it.
                f, h, n = open(folder / name / f"{len(entries):06d}.bin", "wb"), hashlib.sha256(), 0  # noqa: SIM115
            take = chunk[: shard_tokens - n]
            data = np.ascontiguousarray(take).tobytes()
            f.write(data)
            h.update(data)
            n += len(take)
            chunk = chunk[len(take) :]
            if n == shard_tokens:
                close()
                f = None
    if f is not None:
        close()
    return entries


def write_shard_set(
    root: Path,
    streams: dict[str, Chunks],
    stats: dict[str, dict[str, int]],
    dtype: np.dtype,
    shard_tokens: int,
    tokenizer: dict,
    tokenizer_json: str,
) -> dict:
    """Shard files, ``tokenizer.json`` and ``manifest.json`` in ``root``; returns the manifest.

    The new set is built beside ``root`` and swapped in whole, so a failed or killed write (disk
    full, kill -9) leaves the previous shard set as it was and no half-written one in its place.
    """
    total = sum(s["n_tokens"] for s in stats.values())
    with (
        staged_dir(Path(root)) as staging,
        tqdm(total=total, unit="tok", unit_scale=True, desc="shard", mininterval=1.0) as bar,
    ):
        manifest_streams = {}
        for name in sorted(streams):
            entries = _write_stream(staging, name, streams[name], shard_tokens, bar)
            manifest_streams[name] = {"split": name.split("/")[0], **stats[name], "shards": entries}
        manifest = {
            "format": MANIFEST_FORMAT,
            "dtype": str(np.dtype(dtype)),
            "shard_tokens": shard_tokens,
            "tokenizer": tokenizer,
            "versions": versions.deciding(versions.DATA),
            "streams": manifest_streams,
        }
        write_text_atomic(staging / "tokenizer.json", tokenizer_json)
        write_text_atomic(staging / "manifest.json", json.dumps(manifest, indent=1))
    return manifest


@dataclass(frozen=True)
class ShardSpec:
    """What the shard node decides and the shards dataset writes (the tokens stay memory-mapped)."""

    streams: dict[str, Chunks]
    stats: dict[str, dict[str, int]]
    dtype: np.dtype
    shard_tokens: int
    tokenizer: dict
    tokenizer_json: str

    def write(self, root: Path) -> dict:
        return write_shard_set(
            root, self.streams, self.stats, self.dtype, self.shard_tokens, self.tokenizer, self.tokenizer_json
        )
