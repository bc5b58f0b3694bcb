"""Tokenize: fit a byte-level BPE on the training text, then encode every stream."""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

from lehr.corpus import Corpus, capped
from lehr.params import TokenizeParams
from lehr.tokenization import encode_streams, training_sample, train_bpe


def _documents(corpus: Corpus, params: TokenizeParams):
    errors = "strict" if params.on_decode_error == "error" else "replace"
    return capped(corpus.documents(errors), params.max_bytes_per_stream)


def train_tokenizer(corpus: Corpus, params: TokenizeParams) -> Tokenizer:
    sample = training_sample(_documents(corpus, params), params.train_sample_bytes)
    if not sample:
        raise ValueError(f"corpus {corpus.root} has no training documents (only held-out ones?)")
    return train_bpe(sample, params.vocab_size, params.special_tokens, params.min_frequency)


def encode_corpus(corpus: Corpus, tokenizer: Tokenizer, params: TokenizeParams) -> tuple[dict[str, np.ndarray], dict]:
    return encode_streams(tokenizer, _documents(corpus, params), params.batch_size)
