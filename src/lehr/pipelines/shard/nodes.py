"""Shard: cut the token streams into memmap-able files with a sha256 manifest."""

from __future__ import annotations

import functools
from typing import cast

from tokenizers import Tokenizer

from lehr import fixes
from lehr.dataprep.builtin_tasks import documents, make_tasks
from lehr.dataprep.params import ShardParams
from lehr.dataprep.sharding import ShardSpec
from lehr.dataprep.token_index import TokenStoreError
from lehr.dataprep.token_reader import TokenStreams
from lehr.dataprep.tokenization import tokenizer_sha256
from lehr.tokens import ENDOFTEXT

HELDOUT_CHARS = 20_000_000  # per source: the built-in tasks read this much held-out text at most


def heldout_tasks(token_streams: TokenStreams, tokenizer: Tokenizer, params: ShardParams) -> dict[str, list]:
    """Task files made from the held-out streams (``lehr.dataprep.builtin_tasks``)."""
    _check_tokenizer(token_streams, tokenizer)
    if not params.builtin_task_examples:
        return {}
    # The streams' tokenizer (_check_tokenizer): tokenize refuses one without ENDOFTEXT
    eot, heldout = cast(int, tokenizer.token_to_id(ENDOFTEXT)), {}
    for name in (n for n in token_streams.streams if n.startswith("heldout/")):
        docs, chars = [], 0
        for doc in documents(token_streams.chunks(name), eot, tokenizer.decode):
            docs.append(doc)
            chars += len(doc[1])
            if chars > HELDOUT_CHARS:
                break
        heldout[name.split("/", 1)[1]] = docs
    return make_tasks(heldout, params.builtin_task_examples, params.task_seed)


def _check_tokenizer(token_streams: TokenStreams, tokenizer: Tokenizer) -> str:
    sha = tokenizer_sha256(tokenizer)
    if sha != token_streams.tokenizer_sha256:
        raise TokenStoreError(
            f"the tokenizer ({sha[:12]}) is not the one that encoded the token streams in "
            f"{token_streams.root} "
            f"({token_streams.tokenizer_sha256[:12]}): the tokenizer file was replaced after tokenize ran. "
            f"Re-run the tokenize stage (`{fixes.rebuild('tokenize')}`) so tokens and tokenizer match."
        )
    return sha


def shard_streams(token_streams: TokenStreams, tokenizer: Tokenizer, params: ShardParams) -> ShardSpec:
    sha = _check_tokenizer(token_streams, tokenizer)
    info = {
        "sha256": sha,
        "vocab_size": tokenizer.get_vocab_size(),
        "eot_id": tokenizer.token_to_id(ENDOFTEXT),
    }
    names = list(token_streams.streams)
    return ShardSpec(
        {n: functools.partial(token_streams.chunks, n) for n in names},
        {n: token_streams.stats(n) for n in names},
        token_streams.dtype,
        params.shard_tokens,
        info,
        tokenizer.to_str(),
    )
