"""Task evaluations scored by log-likelihood, as lm-evaluation-harness scores them.

A task is a JSONL file, one example per line, of one of two kinds:

* multiple choice ``{"context": str, "choices": [str, ...], "label": int}``: the model picks the
  choice whose continuation of the context it finds likeliest. ``acc`` compares summed
  log-likelihoods; ``acc_norm`` divides each by the choice's UTF-8 bytes first (long choices are
  not penalised for their length).
* cloze ``{"context": str, "target": str}``: ``acc`` is whether greedy decoding reproduces the
  target exactly (the LAMBADA metric); ``loglik`` is the target's summed log-likelihood.

Every figure comes with its standard error (over examples) and the chance level. Contexts longer
than the model sees are cut from the left, and counted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F

from lehr.engine.evals.evaluation import HEAD_TOKENS
from lehr.engine.model import LanguageModel
from lehr.tokens import ENDOFTEXT

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class TaskError(ValueError):
    """A task file that cannot be scored; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class Example:
    context: str
    choices: tuple[str, ...] = ()  # multiple choice
    label: int = -1
    target: str = ""  # cloze


@dataclass(frozen=True)
class Task:
    name: str
    kind: str  # choice | cloze
    examples: tuple[Example, ...]


def read_task(path: Path) -> Task:
    """A task file, every line checked; the first bad one stops it with ``file:line`` and the problem."""
    examples, kinds = [], set()
    raw = path.read_bytes().split(b"\n")
    for number, data in enumerate(raw, 1):
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TaskError(
                f"{path}:{number}: not UTF-8 (byte {data[e.start]:#04x} at column {e.start + 1}); save the "
                f"task file as UTF-8"
            ) from None
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{where}: not a JSON object ({e.msg})") from None
        kind, example = _example(row, where)
        kinds.add(kind)
        if len(kinds) > 1:
            other = (kinds - {kind}).pop()
            raise TaskError(f"{where}: a {kind} example in a task of {other} examples; one kind per file")
        examples.append(example)
    if not examples:
        raise TaskError(f"{path} holds no examples: one JSON object per line, {_FORMATS}")
    return Task(path.stem, kinds.pop(), tuple(examples))


_FORMATS = '{"context", "choices", "label"} or {"context", "target"}'


def _example(row: object, where: str) -> tuple[str, Example]:
    if not isinstance(row, dict) or not isinstance(row.get("context"), str):
        raise TaskError(f'{where}: needs a string "context"; an example is {_FORMATS}')
    if "choices" in row:
        choices, label = row["choices"], row.get("label")
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise TaskError(f'{where}: "choices" must be a non-empty list of non-empty strings')
        if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(choices):
            raise TaskError(f'{where}: "label" = {label!r} must index "choices" (0..{len(choices) - 1})')
        return "choice", Example(row["context"], tuple(choices), label)
    if isinstance(row.get("target"), str) and row["target"]:
        return "cloze", Example(row["context"], target=row["target"])
    raise TaskError(f"{where}: an example is {_FORMATS}")


@dataclass(frozen=True)
class Scored:
    loglik: float  # summed log-likelihood of the continuation, nats
    greedy: bool  # the argmax at every continuation position is the continuation's token
    truncated: bool  # the context was cut from the left to fit the model


class Scorer:
    """Log-likelihoods of continuations under a model, in full precision: in bf16 a near tie goes
    the other way now and then (1 cloze example of 100 at one of the default run's 28 evals).

    Continuations of one context (a question's choices) share a row, as many as fit the model's
    context: the context once, then each continuation, attending to the context and to itself
    only, at the positions it would have alone. Rows go longest first, in batches of at most
    ``batch_size`` x ``seq_len`` tokens, with right padding. So a pair scores the same alone,
    packed or in any batch (up to rounding), and the head runs at the continuations' positions only.
    ``remember`` keeps each pair's tokens, for a caller that scores the same pairs again.
    """

    def __init__(
        self,
        model: LanguageModel,
        tokenizer: Tokenizer,
        device: torch.device,
        batch_size: int = 16,
        remember: bool = False,
    ) -> None:
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.seq_len: int = model.cfg.seq_len
        self.batch_tokens = batch_size * self.seq_len
        self.prefix = cast(int, tokenizer.token_to_id(ENDOFTEXT))  # every lehr tokenizer carries it
        self._encoded: dict[tuple[str, str], tuple[list[int], list[int]]] | None = {} if remember else None

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        if self._encoded is None:
            return self._encode_pair(context, continuation)
        if (context, continuation) not in self._encoded:
            self._encoded[context, continuation] = self._encode_pair(context, continuation)
        return self._encoded[context, continuation]

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        # As lm-evaluation-harness: trailing spaces of the context go with the continuation, and the
        # continuation's tokens are those of the whole text past the context's own tokens.
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        ctx = self.tokenizer.encode(context).ids if context else []
        whole = self.tokenizer.encode(context + continuation).ids
        cont = whole[len(ctx) :] if whole[: len(ctx)] == ctx else self.tokenizer.encode(continuation).ids
        return (ctx or [self.prefix]), cont

    def score(self, pairs: list[tuple[str, str]]) -> list[Scored]:
        return self.score_tokens([self.encode_pair(c, x) for c, x in pairs])

    @torch.no_grad()
    def score_tokens(self, encoded: list[tuple[list[int], list[int]]]) -> list[Scored]:
        """(context ids, continuation ids) pairs, as ``score`` takes text pairs."""
        rows = sorted(self._rows(encoded), key=lambda row: -len(row.ids))
        scored: dict[int, Scored] = {}
        was_training = self.model.training
        self.model.eval()
        while rows:
            n = max(1, self.batch_tokens // len(rows[0].ids))
            scored.update(self._batch(rows[:n]))
            rows = rows[n:]
        self.model.train(was_training)
        return [scored[i] for i in range(len(encoded))]

    def _rows(self, encoded: list[tuple[list[int], list[int]]]) -> list[_Row]:
        # Pairs that fit whole, grouped by their context; a pair cut to fit, or with nothing to
        # score, keeps a row of its own.
        by_context: dict[tuple[int, ...], list[int]] = {}
        for i, (ctx, cont) in enumerate(encoded):
            if cont and len(ctx) + len(cont) <= self.seq_len + 1:
                by_context.setdefault(tuple(ctx), []).append(i)
        rows, alone = [], set(range(len(encoded)))
        for context, pairs in by_context.items():
            for group in self._fitting(len(context), [(i, encoded[i][1]) for i in pairs]):
                if len(group) > 1:
                    rows.append(_Row.shared(list(context), group))
                    alone -= {i for i, _ in group}
        return rows + [_Row.alone(i, *encoded[i], self.seq_len) for i in sorted(alone)]

    def _fitting(
        self, context: int, continuations: list[tuple[int, list[int]]]
    ) -> list[list[tuple[int, list[int]]]]:
        """The continuations in runs that each fit one row of ``seq_len`` tokens after the context."""
        groups: list[list[tuple[int, list[int]]]] = [[]]
        length = context
        for pair in continuations:
            if groups[-1] and length + len(pair[1]) - 1 > self.seq_len:
                groups.append([])
                length = context
            groups[-1].append(pair)
            length += len(pair[1]) - 1
        return groups

    def _batch(self, rows: list[_Row]) -> dict[int, Scored]:
        width = len(rows[0].ids)  # the longest comes first
        x = torch.zeros(len(rows), width, dtype=torch.long)
        for r, row in enumerate(rows):
            x[r, : len(row.ids)] = torch.tensor(row.ids)
        positions = mask = None
        if any(row.segments for row in rows):
            positions, mask = (t.to(self.device) for t in _packing(rows, width))
        # Every prediction the batch scores, as flat lists of its row, its position and its target.
        rows_at, positions_at, target_list = [], [], []
        for r, row in enumerate(rows):
            for _, where, cont in row.scored:
                rows_at += [r] * len(where)
                positions_at += where
                target_list += cont
        token_ll, hit = torch.zeros(0), torch.zeros(0, dtype=torch.bool)
        if target_list:
            hidden = self.model.hidden(x.to(self.device), positions, mask)
            scored_at = hidden[
                torch.tensor(rows_at, device=self.device), torch.tensor(positions_at, device=self.device)
            ]
            token_ll, hit = _target_logprobs(
                self.model, scored_at, torch.tensor(target_list, device=self.device)
            )
        out, at = {}, 0
        for row in rows:
            for pair, _, cont in row.scored:
                part = slice(at, at + len(cont))
                out[pair] = Scored(token_ll[part].sum().item(), bool(hit[part].all()), row.truncated)
                at += len(cont)
        return out


def _target_logprobs(
    model: LanguageModel, hidden: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each target's log-probability and whether it is the argmax, the head in slices of
    HEAD_TOKENS positions; only these two values per position go to the host."""
    lls, hits = [], []
    for i in range(0, len(targets), HEAD_TOKENS):
        logprobs = F.log_softmax(model.logits(hidden[i : i + HEAD_TOKENS]).float(), dim=-1)
        part = targets[i : i + HEAD_TOKENS]
        lls.append(logprobs.gather(1, part[:, None])[:, 0])
        hits.append(logprobs.argmax(-1) == part)
    return torch.cat(lls).cpu(), torch.cat(hits).cpu()


@dataclass(frozen=True)
class _Row:
    """A batch row: one pair's context and continuation, or one context and several continuations."""

    ids: list[int]  # the input tokens
    segments: list[int] | None  # per input: 0 the context, j the j-th continuation; None: one sequence
    scored: list[tuple[int, list[int], list[int]]]  # (pair, the positions predicting its tokens, the tokens)
    truncated: bool  # the context was cut from the left to fit the model

    @classmethod
    def alone(cls, pair: int, ctx: list[int], cont: list[int], seq_len: int) -> _Row:
        cont = cont[-seq_len:]  # a continuation longer than the model sees keeps its end
        ids = (ctx + cont)[-(seq_len + 1) :]
        start = len(ids) - 1 - len(cont)
        return cls(
            ids[:-1],
            None,
            [(pair, list(range(start, start + len(cont))), cont)],
            len(ctx) + len(cont) > len(ids),
        )

    @classmethod
    def shared(cls, ctx: list[int], continuations: list[tuple[int, list[int]]]) -> _Row:
        ids, segments, scored = list(ctx), [0] * len(ctx), []
        for j, (pair, cont) in enumerate(continuations, 1):
            # The context's last position predicts every continuation's first token.
            scored.append((pair, [len(ctx) - 1, *range(len(ids), len(ids) + len(cont) - 1)], cont))
            ids += cont[:-1]
            segments += [j] * (len(cont) - 1)
        return cls(ids, segments, scored, False)


def _packing(rows: list[_Row], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's position and what it attends to: the tokens at or before it in its own
    segment or the context (segment 0). Padding is a segment of its own, so no query is empty."""
    positions, segments = [], []
    for row in rows:
        seg = row.segments or [0] * len(row.ids)
        context, counted = seg.count(0), dict.fromkeys(seg, 0)
        at = []
        for i, s in enumerate(seg):  # a continuation's tokens take the places after the context
            at.append(i if s == 0 else context + counted[s])
            counted[s] += 1
        pad = width - len(seg)
        positions.append(at + [0] * pad)
        segments.append(seg + [-1] * pad)
    seg_t = torch.tensor(segments)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    mask = causal & ((seg_t[:, :, None] == seg_t[:, None, :]) | (seg_t[:, None, :] == 0))
    return torch.tensor(positions), mask[:, None]


def _mean_stderr(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def evaluate_task(scorer: Scorer, task: Task, limit: int | None = None) -> dict[str, float]:
    """The task's metrics (each with ``_stderr``), its chance level, and how many examples were
    scored and truncated. ``limit`` takes the first examples only (the in-loop evals)."""
    examples = task.examples[:limit] if limit else task.examples
    metrics, chance, truncated = task_outcomes(scorer, task, limit)
    out: dict[str, float] = {}
    for name, values in metrics.items():
        out[name], out[f"{name}_stderr"] = _mean_stderr(values)
    out["chance"] = sum(chance) / len(chance)
    out["examples"], out["truncated"] = len(examples), truncated
    return out


def task_outcomes(
    scorer: Scorer, task: Task, limit: int | None = None
) -> tuple[dict[str, list[float]], list[float], int]:
    """Each example's outcome per metric (1/0 for accuracies, the log-likelihood), each one's
    chance of being right, and how many were truncated."""
    examples = task.examples[:limit] if limit else task.examples
    if task.kind == "choice":
        pairs = [(e.context, c) for e in examples for c in e.choices]
        scores = iter(scorer.score(pairs))
        acc, acc_norm, chance, truncated = [], [], [], 0
        for e in examples:
            got = [next(scores) for _ in e.choices]
            truncated += any(s.truncated for s in got)
            lls = [s.loglik for s in got]
            normed = [ll / len(c.encode("utf-8")) for ll, c in zip(lls, e.choices, strict=True)]
            acc.append(float(max(range(len(lls)), key=lls.__getitem__) == e.label))
            acc_norm.append(float(max(range(len(normed)), key=normed.__getitem__) == e.label))
            chance.append(1 / len(e.choices))
        metrics = {"acc": acc, "acc_norm": acc_norm}
    else:
        scored = scorer.score([(e.context, e.target) for e in examples])
        truncated = sum(s.truncated for s in scored)
        vocab = scorer.model.cfg.vocab_size
        chance = [vocab ** -len(scorer.encode_pair(e.context, e.target)[1]) for e in examples]
        metrics = {"acc": [float(s.greedy) for s in scored], "loglik": [s.loglik for s in scored]}
    return metrics, chance, truncated
