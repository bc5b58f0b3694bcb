"""Random-token shards for benchmarks that measure speed, not learning (any vocab size)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models

from lehr.dataprep.sharding import write_shard_set
from lehr.dataprep.tokenization import token_dtype, tokenizer_sha256


def synthetic_shards(
    root: Path, vocab_size: int, n_tokens: int = 4_000_000, shard_tokens: int = 1 << 20
) -> Path:
    rng = np.random.default_rng(0)
    dtype = token_dtype(vocab_size)
    streams = {
        "train/gold": rng.integers(0, vocab_size, n_tokens).astype(dtype),
        "train/silver": rng.integers(0, vocab_size, n_tokens // 2).astype(dtype),
        "heldout/synthetic": rng.integers(0, vocab_size, shard_tokens).astype(dtype),
    }
    stats = {k: {"n_docs": 1, "n_bytes": 4 * len(v), "n_tokens": len(v)} for k, v in streams.items()}
    tok = Tokenizer(models.BPE())
    info = {"sha256": tokenizer_sha256(tok), "vocab_size": vocab_size, "eot_id": 0}
    write_shard_set(
        root,
        {k: (lambda v=v: iter([v])) for k, v in streams.items()},
        stats,
        dtype,
        shard_tokens,
        info,
        tok.to_str(),
    )
    return root
