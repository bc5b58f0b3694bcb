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

import torch
import torch.nn.functional as F

from lehr.tokens import ENDOFTEXT


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
    """Log-likelihoods of continuations under a model, batched with right padding (a causal model
    never sees the padding, so a pair scores the same alone or in any batch)."""

    def __init__(self, model: torch.nn.Module, tokenizer, device: torch.device, batch_size: int = 16):
        self.model, self.tokenizer, self.device, self.batch_size = model, tokenizer, device, batch_size
        self.seq_len = model.cfg.seq_len
        self.prefix = tokenizer.token_to_id(ENDOFTEXT)

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
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
        out: list[Scored] = []
        was_training = self.model.training
        self.model.eval()
        for i in range(0, len(encoded), self.batch_size):
            out += self._batch(encoded[i : i + self.batch_size])
        self.model.train(was_training)
        return out

    def _batch(self, encoded: list[tuple[list[int], list[int]]]) -> list[Scored]:
        rows, spans = [], []
        for ctx, cont in encoded:
            cont = cont[-self.seq_len :]  # a continuation longer than the model sees keeps its end
            ids = (ctx + cont)[-(self.seq_len + 1) :]
            rows.append(ids)
            spans.append((len(ids) - 1 - len(cont), len(cont), len(ctx) + len(cont) > len(ids)))
        width = max(len(r) for r in rows) - 1
        x = torch.zeros(len(rows), width, dtype=torch.long)
        for r, ids in enumerate(rows):
            x[r, : len(ids) - 1] = torch.tensor(ids[:-1])
        logits, _ = self.model(x.to(self.device))
        logprobs = F.log_softmax(logits.float(), dim=-1).cpu()
        scored = []
        for r, (start, n, truncated) in enumerate(spans):
            targets = torch.tensor(rows[r][start + 1 : start + 1 + n])
            lp = logprobs[r, start : start + n]
            loglik = lp.gather(1, targets[:, None]).sum().item()
            scored.append(Scored(loglik, bool((lp.argmax(-1) == targets).all()), truncated))
        return scored


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
            normed = [ll / len(c.encode("utf-8")) for ll, c in zip(lls, e.choices)]
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
