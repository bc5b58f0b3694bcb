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

import numpy as np

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
