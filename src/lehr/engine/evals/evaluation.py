"""Held-out evaluation: loss, perplexity and bits-per-byte per source, a unigram baseline, samples."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
import torch.nn.functional as F

from lehr.engine.artifacts.checkpoint import load_weights, verify
from lehr.engine.batches import Source, eval_windows
from lehr.engine.hardware import Hardware
from lehr.engine.model import LanguageModel, ModelConfig, Transformer
from lehr.tokens import ENDOFTEXT

if TYPE_CHECKING:
    from tokenizers import Tokenizer

LN2 = math.log(2)


@dataclass(frozen=True)
class HeldOut:
    """The fixed windows of every held-out source, built once per run."""

    windows: dict[str, np.ndarray]  # source name -> (n, seq_len + 1)
    bytes_per_token: dict[str, float]

    @classmethod
    def build(cls, sources: list[Source], seq_len: int, n_windows: int) -> HeldOut:
        return cls(
            {s.name.split("/", 1)[1]: eval_windows(s, seq_len, n_windows) for s in sources},
            {s.name.split("/", 1)[1]: s.bytes_per_token for s in sources},
        )


# The tokens one eval forward pass takes (whole windows, at least micro_batch of them): bigger
# passes than training's micro-batch, which holds activations for a backward, run the CPU's matmuls
# nearer its peak. The head and its loss then go in slices of HEAD_TOKENS positions, so the logits
# are never held for the whole pass (at a 4096 vocabulary they were 134 MB in fp32, written and
# read again at memory speed).
EVAL_TOKENS = 4096
HEAD_TOKENS = 1024


def windows_per_pass(seq_len: int, micro_batch: int) -> int:
    return max(micro_batch, EVAL_TOKENS // seq_len)


def token_nats(model: LanguageModel, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each position's loss in nats (float32, shaped like ``targets``), the head in slices."""
    hidden = model.hidden(inputs).flatten(0, 1)
    flat = targets.reshape(-1)
    nats = [
        F.cross_entropy(
            model.logits(hidden[i : i + HEAD_TOKENS]).float(), flat[i : i + HEAD_TOKENS], reduction="none"
        )
        for i in range(0, len(flat), HEAD_TOKENS)
    ]
    return torch.cat(nats).view_as(targets)


def _window_nats(model: LanguageModel, windows: np.ndarray, hw: Hardware, micro_batch: int) -> torch.Tensor:
    """Every window's summed loss in nats (float64, on the device: the caller reads it once)."""
    step = windows_per_pass(windows.shape[1] - 1, micro_batch)
    sums = []
    for i in range(0, len(windows), step):
        w = torch.from_numpy(windows[i : i + step]).to(hw.device)
        with hw.compute():
            sums.append(token_nats(model, w[:, :-1], w[:, 1:]).double().sum(-1))
    return torch.cat(sums)


@torch.no_grad()
def evaluate(
    model: LanguageModel, held: HeldOut, hw: Hardware, micro_batch: int
) -> dict[str, dict[str, float]]:
    """Mean loss (nats/token), perplexity and bits-per-byte per source and over all of them.

    Bits-per-byte divides by the UTF-8 bytes the tokens stand for, so models with different
    tokenizers compare on the same footing.
    """
    was_training = model.training
    model.eval()
    out: dict[str, dict[str, float]] = {}
    nats_total, bytes_total, tokens_total = 0.0, 0.0, 0
    for name, windows in held.windows.items():
        nats = _window_nats(model, windows, hw, micro_batch).sum().item()  # one host read per source
        n_tokens = windows[:, 1:].size
        loss = nats / n_tokens
        out[name] = {
            "loss": loss,
            "ppl": math.exp(min(loss, 50)),
            "bpb": loss / LN2 / held.bytes_per_token[name],
        }
        nats_total += nats
        bytes_total += n_tokens * held.bytes_per_token[name]
        tokens_total += n_tokens
    loss = nats_total / tokens_total
    out["heldout"] = {"loss": loss, "ppl": math.exp(min(loss, 50)), "bpb": nats_total / LN2 / bytes_total}
    model.train(was_training)
    return out


@torch.no_grad()
def window_nats(model: LanguageModel, held: HeldOut, hw: Hardware, micro_batch: int) -> dict[str, np.ndarray]:
    """Each held-out window's summed loss in nats, per source: the items a paired comparison of
    two models resamples (``lehr.reports.comparison``)."""
    was_training = model.training
    model.eval()
    out = {
        name: _window_nats(model, windows, hw, micro_batch).cpu().numpy()
        for name, windows in held.windows.items()
    }
    model.train(was_training)
    return out


def prompt_ids(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """The prompt's tokens; an empty prompt starts where a document does, after end-of-text."""
    # cast: every lehr tokenizer carries the token (lehr.tokens)
    return tokenizer.encode(prompt).ids or [cast(int, tokenizer.token_to_id(ENDOFTEXT))]


@torch.no_grad()
def sample(
    model: LanguageModel,
    ids: list[int],
    n_tokens: int,
    device: torch.device,
    *,
    temperature: float = 0.8,
    top_k: int = 40,
    seed: int = 1234,
) -> Iterator[torch.Tensor]:
    """The tokens continuing ``ids``, one at a time, each a tensor on ``device`` (reading one is
    the caller's host sync). A fixed seed gives the same tokens, so samples at different steps compare."""
    gen = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    x = torch.tensor([ids], device=device)
    try:
        for _ in range(n_tokens):
            x = model.generate(x, 1, temperature=temperature, top_k=top_k, generator=gen)
            yield x[0, -1]
    finally:
        model.train(was_training)


def sample_text(
    model: LanguageModel, tokenizer: Tokenizer, prompt: str, n_tokens: int, device: torch.device
) -> str:
    """The prompt and a short continuation of it, read from the device once."""
    ids = prompt_ids(tokenizer, prompt)
    new = list(sample(model, ids, n_tokens, device))
    return tokenizer.decode(ids + (torch.stack(new).tolist() if new else []))


def load_model(path: str | Path, device: torch.device) -> Transformer:
    """A model rebuilt from a checkpoint's own config and weights, ready for evaluation; refused
    unless every file matches the sha256 its state records (as a resume does)."""
    state = verify(Path(path))
    model = Transformer(ModelConfig(**state["config"]["model"]))
    load_weights(Path(path), model)
    return model.to(device).eval()


def unigram_bpb(train_sources: list[Source], held: HeldOut, vocab_size: int) -> dict[str, dict[str, float]]:
    """Bits-per-byte of an add-one-smoothed unigram model of the training tokens: the floor any
    language model must beat by a wide margin."""
    counts = np.ones(vocab_size, dtype=np.float64)
    for source in train_sources:
        for shard in source.shards:
            counts += np.bincount(shard, minlength=vocab_size)[:vocab_size]
    nll = -np.log(counts / counts.sum())
    out, nats_total, bytes_total = {}, 0.0, 0.0
    for name, windows in held.windows.items():
        targets = windows[:, 1:]
        nats = float(nll[targets].sum())
        out[name] = {"bpb": nats / targets.size / LN2 / held.bytes_per_token[name]}
        nats_total += nats
        bytes_total += targets.size * held.bytes_per_token[name]
    out["heldout"] = {"bpb": nats_total / LN2 / bytes_total}
    return out
