"""Byte-level BPE with HF ``tokenizers``: training on a deterministic sample, batched encoding."""

from __future__ import annotations

import hashlib
import heapq
import itertools
import re
from collections.abc import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lehr.dataprep.corpus import Document, cut_points
from lehr.tokens import ENDOFTEXT


class SampleHeap:
    """The BPE sample: training documents ordered by content hash, up to ``max_bytes`` of UTF-8.

    Ordering by hash rather than by file spreads the sample over the whole corpus (file order
    would pick only the oldest speeches) while staying free of any RNG. Streamed: the heap keeps
    the smallest hashes seen so far and drops its largest while the rest still fill the budget, so
    memory is bounded by the budget, and the result is the prefix a full sort would give. Heaps of
    disjoint parts of the corpus merge into the heap of the whole (every document of the whole's
    prefix is in its own part's prefix), which lets worker processes sample in parallel.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes, self.used = max_bytes, 0
        self.heap: list[tuple[int, str, int]] = []  # (-hash, text, bytes): heap[0] holds the largest hash

    def add(self, text: str) -> None:
        raw = text.encode("utf-8")
        self.add_keyed(-int.from_bytes(hashlib.sha256(raw).digest(), "big"), text, len(raw))

    def add_keyed(self, key: int, text: str, size: int) -> None:
        heap = self.heap
        if self.max_bytes and heap and self.used >= self.max_bytes and key < heap[0][0]:
            return  # a hash above everything kept, while the kept documents already fill the budget
        heapq.heappush(heap, (key, text, size))
        self.used += size
        while self.max_bytes and len(heap) > 1 and self.used - heap[0][2] >= self.max_bytes:
            self.used -= heapq.heappop(heap)[2]

    def merge(self, items: Iterable[tuple[int, str, int]]) -> None:
        for item in items:
            self.add_keyed(*item)

    def texts(self) -> list[str]:
        return [text for _, text, _ in sorted(self.heap, reverse=True)]


def training_sample(docs: Iterable[Document], max_bytes: int) -> list[str]:
    """The training documents' sample (see ``SampleHeap``), read in one pass."""
    heap = SampleHeap(max_bytes)
    for d in docs:
        if d.stream.startswith("train/"):
            heap.add(d.text)
    return heap.texts()


# BPE training time grows with the square of a pre-tokenized word's length (a 400K-character
# word took 32 s): no word longer than this reaches the trainer. Encoding is not affected.
MAX_BPE_WORD = 1000
_LONG_WORD = re.compile(rf"\S{{{MAX_BPE_WORD + 1},}}")  # a run of over MAX_BPE_WORD non-spaces


def _cap_words(text: str) -> str:
    def cut(m: re.Match) -> str:
        w = m.group(0)
        return " ".join(w[i : i + MAX_BPE_WORD] for i in range(0, len(w), MAX_BPE_WORD))

    return _LONG_WORD.sub(cut, text)


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
    tok.train_from_iterator((_cap_words(t) for t in texts), trainer=trainer, length=len(texts))
    return tok


def tokenizer_sha256(tok: Tokenizer) -> str:
    """Hash of the serialized tokenizer, exactly as TokenizerDataset writes it."""
    return hashlib.sha256(tok.to_str().encode("utf-8")).hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


# Encoding holds ~60 bytes per character of a batch at once (a 40 MB text file's pieces, all in
# one batch of 512 documents, peaked at 2.4 GB), so a batch closes at BATCH_CHARS characters as
# well as at ``batch_size`` documents, and a long document or piece is encoded in parts of about
# ENCODE_CHARS, which the cores share out. Both cut only where the pre-tokenizer splits anyway.
BATCH_CHARS = 1 << 20
ENCODE_CHARS = 1 << 16


def encode_documents(
    tok: Tokenizer, docs: Iterator[Document], batch_size: int
) -> Iterator[tuple[Document, np.ndarray]]:
    """Each document (or piece) with its token ids, end-of-text after a document's last piece.

    ``encode_batch_fast`` runs a batch on all the cores it is given, in Rust, and skips offset
    tracking, which lehr never uses. Batching changes no token: each text is encoded on its own,
    and the parts of one are cut where a pre-token starts (``cut_points`` without hard cuts).
    """
    eot = tok.token_to_id(ENDOFTEXT)
    if eot is None:
        raise ValueError(f"the tokenizer has no {ENDOFTEXT} token; add it to tokenize.special_tokens")
    dtype = token_dtype(tok.get_vocab_size())
    batch: list[tuple[Document, list[str]]] = []
    chars = 0
    for d in itertools.chain(docs, [None]):
        if d is not None:
            parts = (
                list(cut_points(d.text, ENCODE_CHARS, hard=False)) if len(d.text) > ENCODE_CHARS else [d.text]
            )
            batch.append((d, parts))
            chars += len(d.text)
            if len(batch) < batch_size and chars < BATCH_CHARS:
                continue
        encodings = iter(
            tok.encode_batch_fast([p for _, parts in batch for p in parts], add_special_tokens=False)
        )
        for doc, parts in batch:
            ids = [i for _ in parts for i in next(encodings).ids]
            yield doc, np.array(ids + [eot] if doc.last else ids, dtype=dtype)
        batch, chars = [], 0
