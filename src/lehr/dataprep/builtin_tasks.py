"""Task files made from the held-out split, so every corpus comes with task evaluations that
need no download and never touch training text (the format of ``lehr.engine.evals.tasks``).

* ``heldout_last_word`` (cloze, LAMBADA-style): a paragraph with up to ``CONTEXT_CHARS`` of the
  text before it; the target is its last word.
* ``heldout_next_sentence`` (4-way multiple choice): up to three sentences of a paragraph; the
  choices are the sentence that follows and three sentences from other documents of the same
  source (other paragraphs of the same document when a source has only one).

Both are deterministic: examples are taken in document order, and the distractors and the place
of the right answer come from a generator seeded by ``seed``, the source and the example.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import numpy as np

CONTEXT_CHARS = 400  # text before the last word of a cloze passage, cut at a word boundary
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
_LAST_WORD = re.compile(r"\s([A-Za-z][a-z]{2,})[^\w\s]*\s*$")


def documents(chunks: Iterator[np.ndarray], eot_id: int, decode) -> Iterator[tuple[int, str]]:
    """(document index, text) of a token stream, documents split at the end-of-text token."""
    pending: list[np.ndarray] = []
    index = 0
    for chunk in chunks:
        ends = np.flatnonzero(chunk == eot_id)
        start = 0
        for end in ends:
            pending.append(chunk[start:end])
            yield index, decode(np.concatenate(pending).tolist())
            index, pending, start = index + 1, [], int(end) + 1
        pending.append(chunk[start:])
    if sum(len(p) for p in pending):
        yield index, decode(np.concatenate(pending).tolist())


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n|\n", text) if len(p.strip()) >= 80]


def last_word(docs: list[tuple[int, str]], limit: int) -> list[dict]:
    out = []
    for _, text in docs:
        before = ""
        for para in _paragraphs(text):
            m = _LAST_WORD.search(para)
            if m:
                context = (before + para[: m.start(1)]).rstrip(" ")
                cut = context[-CONTEXT_CHARS:]
                context = cut[cut.find(" ") + 1 :] if len(context) > CONTEXT_CHARS else context
                out.append({"context": context.rstrip(), "target": " " + m.group(1)})
                if len(out) >= limit:
                    return out
            before += para + "\n"
    return out


def next_sentence(docs: list[tuple[int, str]], limit: int, seed: int, source: str) -> list[dict]:
    units = [(d, i, _sentences(p)) for d, text in docs for i, p in enumerate(_paragraphs(text))]
    pool = [(d, i, s) for d, i, sents in units for s in sents]
    several_docs = len({d for d, _, _ in units}) > 1
    out = []
    for n, (d, i, sents) in enumerate(units):
        if len(sents) < 2:
            continue
        rng = random.Random(f"{seed}:{source}:{n}")
        k = rng.randrange(1, len(sents))
        right = sents[k]
        # Distractors from other documents, or (one document) from paragraphs at least two away.
        others = [s for od, oi, s in pool if (od != d if several_docs else abs(oi - i) > 1) and s != right]
        if len(set(others)) < 3:
            continue
        choices = rng.sample(sorted(set(others)), 3)
        label = rng.randrange(4)
        choices.insert(label, right)
        out.append(
            {
                "context": " ".join(sents[max(0, k - 3) : k]),
                "choices": [" " + c for c in choices],
                "label": label,
            }
        )
        if len(out) >= limit:
            break
    return out


def _sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(paragraph) if 20 <= len(s.strip()) <= 300]


def make_tasks(heldout: dict[str, list[tuple[int, str]]], limit: int, seed: int) -> dict[str, list[dict]]:
    """``heldout``: source -> its documents. ``limit`` examples per source and task."""
    tasks: dict[str, list[dict]] = {"heldout_last_word": [], "heldout_next_sentence": []}
    for source, docs in sorted(heldout.items()):
        tasks["heldout_last_word"] += last_word(docs, limit)
        tasks["heldout_next_sentence"] += next_sentence(docs, limit, seed, source)
    return {name: examples for name, examples in tasks.items() if examples}
