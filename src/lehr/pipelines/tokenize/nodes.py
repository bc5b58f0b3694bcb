"""Tokenize: fit a byte-level BPE on a sample of the training text, then encode every stream to disk."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from lehr.dataprep.corpus import Corpus
from lehr.dataprep.params import TokenizeParams
from lehr.dataprep.token_writer import Settings, bpe_sample, encode_corpus_to_parts
from lehr.dataprep.tokenization import train_bpe


def _settings(params: TokenizeParams) -> Settings:
    return Settings(
        errors="strict" if params.on_decode_error == "error" else "replace",
        text_field=params.text_field,
        cap=params.max_bytes_per_stream,
        batch_size=params.batch_size,
    )


def train_tokenizer(corpus: Corpus, params: TokenizeParams) -> Tokenizer:
    sample = bpe_sample(
        Corpus(corpus.root, params.text_field), _settings(params), params.train_sample_bytes, params.workers
    )
    if not sample:
        raise ValueError(f"corpus {corpus.root} has no training documents (only held-out ones?)")
    return train_bpe(sample, params.vocab_size, params.special_tokens, params.min_frequency)


def encode_corpus(corpus: Corpus, tokenizer: Tokenizer, params: TokenizeParams, token_parts: Path) -> dict:
    """Tokens go to ``token_parts`` as they are made; returns the index the catalog saves beside them."""
    return encode_corpus_to_parts(
        Corpus(corpus.root, params.text_field),
        tokenizer,
        Path(token_parts),
        _settings(params),
        params.workers,
        params.slice,
        params.reuse_under_new_versions,
    )


def tokenize(corpus: Corpus, params: TokenizeParams, token_parts: Path) -> tuple[Tokenizer, dict]:
    """Both steps in one node, so Kedro saves the tokenizer only once every stream is encoded: a
    corpus file that fails to read (held-out files are read only when encoding) leaves the previous
    tokenizer and index in place, still a matching pair."""
    tokenizer = train_tokenizer(corpus, params)
    return tokenizer, encode_corpus(corpus, tokenizer, params, token_parts)
