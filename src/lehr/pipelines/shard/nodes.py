"""Shard: cut token streams into memmap-able files with a sha256 manifest."""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

from lehr.params import ShardParams
from lehr.sharding import cut_shards
from lehr.tokenization import EOT, tokenizer_sha256


def shard_streams(
    token_streams: tuple[dict[str, np.ndarray], dict], tokenizer: Tokenizer, params: ShardParams
) -> tuple[dict[str, np.ndarray], dict, str]:
    streams, stats = token_streams
    info = {"sha256": tokenizer_sha256(tokenizer), "vocab_size": tokenizer.get_vocab_size(),
            "eot_id": tokenizer.token_to_id(EOT)}
    shards, manifest = cut_shards(streams, stats, params.shard_tokens, info)
    return shards, manifest, tokenizer.to_str()
