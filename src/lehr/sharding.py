"""Cut token streams into fixed-size shards and describe them in a manifest.

Manifest (``manifest.json``, format 1)::

    {"format": 1, "dtype": "uint16", "shard_tokens": N,
     "tokenizer": {"sha256": ..., "vocab_size": ..., "eot_id": ...},
     "streams": {"train/gold": {"split": "train", "n_docs", "n_bytes", "n_tokens",
                                "shards": [{"file": "train/gold/000000.bin", "n_tokens", "sha256"}]}}}

Shard files are raw little-endian arrays of ``dtype`` that the training loop ``np.memmap``s.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from lehr.atomic import write_bytes_atomic, write_text_atomic

MANIFEST_FORMAT = 1


def cut_shards(
    streams: dict[str, np.ndarray], stats: dict[str, dict[str, int]], shard_tokens: int, tokenizer: dict
) -> tuple[dict[str, np.ndarray], dict]:
    smallest = min(streams, key=lambda s: len(streams[s]))
    if shard_tokens > len(streams[smallest]):
        raise ValueError(
            f"parameter shard.shard_tokens = {shard_tokens} is larger than the data: stream "
            f"{smallest} has only {len(streams[smallest])} tokens. Use shard.shard_tokens <= "
            f"{len(streams[smallest])}."
        )
    shards: dict[str, np.ndarray] = {}
    manifest_streams = {}
    dtypes = {a.dtype for a in streams.values()}
    assert len(dtypes) == 1, f"token streams disagree on dtype: {dtypes}"
    for name, tokens in streams.items():
        entries = []
        for i, start in enumerate(range(0, len(tokens), shard_tokens)):
            part = np.ascontiguousarray(tokens[start:start + shard_tokens])
            file = f"{name}/{i:06d}.bin"
            shards[file] = part
            entries.append({"file": file, "n_tokens": int(len(part)),
                            "sha256": hashlib.sha256(part.tobytes()).hexdigest()})
        manifest_streams[name] = {"split": name.split("/")[0], **stats[name], "shards": entries}
    manifest = {
        "format": MANIFEST_FORMAT,
        "dtype": str(next(iter(dtypes))),
        "shard_tokens": shard_tokens,
        "tokenizer": tokenizer,
        "streams": manifest_streams,
    }
    return shards, manifest


def write_shard_set(root: Path, shards: dict[str, np.ndarray], manifest: dict, tokenizer_json: str) -> None:
    """Shard files, ``tokenizer.json`` and ``manifest.json`` in ``root``.

    Each shard is written under a temporary name and renamed, and the manifest goes last, so a
    killed run never leaves a manifest that claims a shard that is not complete on disk.
    """
    manifest_path = root / "manifest.json"
    manifest_path.unlink(missing_ok=True)
    for stale in set(root.glob("**/*.bin")) - {root / f for f in shards}:
        stale.unlink()
    for file, tokens in shards.items():
        write_bytes_atomic(root / file, tokens.tobytes())
    write_text_atomic(root / "tokenizer.json", tokenizer_json)
    write_text_atomic(manifest_path, json.dumps(manifest, indent=1))
