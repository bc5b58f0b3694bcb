"""Byte-level BPE with HF ``tokenizers``: training on a deterministic sample, batched encoding."""

from __future__ import annotations

import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm

from lehr.corpus import Document

log = logging.getLogger(__name__)
EOT = "<|endoftext|>"


def training_sample(docs: Iterable[Document], max_bytes: int) -> list[str]:
    """Training-split documents ordered by content hash, up to ``max_bytes`` of UTF-8.

    Ordering by hash rather than by file spreads the sample over the whole corpus (file order
    would pick only the oldest speeches) while staying free of any RNG.
    """
    train = [d.text for d in docs if d.stream.startswith("train/")]
    train.sort(key=lambda t: hashlib.sha256(t.encode("utf-8")).digest())
    sample, used = [], 0
    for text in train:
        if max_bytes and used >= max_bytes:
            break
        sample.append(text)
        used += len(text.encode("utf-8"))
    return sample


def train_bpe(texts: list[str], vocab_size: int, special_tokens: list[str], min_frequency: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def tokenizer_sha256(tok: Tokenizer) -> str:
    """Hash of the serialized tokenizer, exactly as TokenizerDataset writes it."""
    return hashlib.sha256(tok.to_str().encode("utf-8")).hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def _batches(docs: Iterator[Document], size: int) -> Iterator[list[Document]]:
    batch: list[Document] = []
    for d in docs:
        batch.append(d)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def encode_streams(
    tok: Tokenizer, docs: Iterator[Document], batch_size: int, total_docs: int | None = None
) -> tuple[dict[str, np.ndarray], dict[str, dict[str, int]]]:
    """Encode every document, end-of-text after each; returns token arrays and per-stream stats.

    ``encode_batch_fast`` runs the batch on all cores in Rust and skips offset tracking, which
    lehr never uses.
    """
    eot = tok.token_to_id(EOT)
    if eot is None:
        raise ValueError(f"the tokenizer has no {EOT} token; add it to tokenize.special_tokens")
    dtype = token_dtype(tok.get_vocab_size())
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    stats: dict[str, dict[str, int]] = defaultdict(lambda: {"n_docs": 0, "n_bytes": 0, "n_tokens": 0})
    t0, n_bytes = time.perf_counter(), 0
    bar = tqdm(total=total_docs, unit="doc", desc="encode", mininterval=1.0)
    for batch in _batches(docs, batch_size):
        encodings = tok.encode_batch_fast([d.text for d in batch], add_special_tokens=False)
        for doc, enc in zip(batch, encodings):
            ids = np.fromiter(enc.ids, dtype=dtype, count=len(enc.ids))
            parts[doc.stream].append(np.append(ids, np.array([eot], dtype=dtype)))
            s = stats[doc.stream]
            b = len(doc.text.encode("utf-8"))
            s["n_docs"] += 1
            s["n_bytes"] += b
            s["n_tokens"] += len(ids) + 1
            n_bytes += b
        bar.update(len(batch))
    bar.close()
    seconds = max(time.perf_counter() - t0, 1e-9)
    n_tokens = sum(s["n_tokens"] for s in stats.values())
    log.info(
        "encoded %.1f MB in %.1f s (%.2f MB/s), %.3f tokens per byte",
        n_bytes / 1e6, seconds, n_bytes / 1e6 / seconds, n_tokens / max(n_bytes, 1),
    )
    streams = {name: np.concatenate(chunks) for name, chunks in sorted(parts.items())}
    return streams, {name: dict(stats[name]) for name in streams}
