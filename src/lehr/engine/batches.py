"""The shard stream: deterministic training windows and fixed held-out windows.

Training windows are counter-based: the windows of step ``s`` come from a generator seeded with
``(data_seed, s)``, so the stream's whole state is the step it is at. A resumed run therefore
sees exactly the batches an uninterrupted run would, with nothing to replay. Every rank draws
the same global batch and keeps its own slice, so ranks see disjoint windows and N processes
see the same data as one process with the same global batch.

A row is a window at a random position (``packing: windows``), or whole documents packed from
its start (``bos_best_fit``, nanochat's BOS-aligned best fit): the largest drawn document that
still fits, again and again, and when none fits the shortest cropped to fill the row. Each
document starts with the end-of-text token that ends the one before it (lehr's shards hold
``doc EOT doc EOT ...``), so a row starts at a document's start. A document longer than a row is
cut into rows of its own, where nanochat crops it: a tier of long documents (lehr's State of the
Union speeches, a median of 7,011 tokens) would otherwise keep 2% of its tokens. The rows'
documents are drawn from the step's generator too: the same resume, the same slices per rank.
"""

from __future__ import annotations

import hashlib
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from lehr import fixes
from lehr.files.atomic import sha256_file

Packing = Literal["windows", "bos_best_fit"]
PACKINGS: tuple[Packing, ...] = typing.get_args(Packing)
POOL_PER_ROW = 8  # documents drawn per packed row to choose among (nanochat keeps a buffer of them)


class DataError(ValueError):
    """Shards that cannot be trained on; the message says why and what to do."""


@dataclass(frozen=True)
class Source:
    name: str  # stream name, e.g. "train/gold" or "heldout/sotu"
    shards: list[np.ndarray]  # memmaps
    n_bytes: int
    n_tokens: int

    @property
    def bytes_per_token(self) -> float:
        return self.n_bytes / max(self.n_tokens, 1)


def load_manifest(shard_dir: str | Path) -> dict[str, Any]:
    path = Path(shard_dir) / "manifest.json"
    if not path.is_file():
        raise DataError(f"{path} is missing: run the shard stage first (`{fixes.rebuild('shard')}`)")
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
        return manifest
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path} is corrupt ({e}): rebuild it with `{fixes.force_rebuild('shard')}`"
        ) from None


def manifest_sha256(shard_dir: str | Path) -> str:
    return hashlib.sha256((Path(shard_dir) / "manifest.json").read_bytes()).hexdigest()


class ShardSet:
    """Every stream of a manifest, verified (sha256, tokenizer, vocab) and memory-mapped."""

    def __init__(self, shard_dir: str | Path, vocab_size: int, seq_len: int, verify: bool = True):
        self.root = Path(shard_dir)
        self.manifest = load_manifest(self.root)
        tok = self.manifest["tokenizer"]
        if tok["vocab_size"] != vocab_size:
            raise DataError(
                f"vocab mismatch: shards in {self.root} were made with a tokenizer of {tok['vocab_size']} "
                f"tokens but the model has vocab_size {vocab_size}; set model.vocab_size to "
                f"{tok['vocab_size']} (or leave it unset) or re-run tokenize and shard"
            )
        tok_file = self.root / "tokenizer.json"
        if tok_file.is_file() and sha256_file(tok_file) != tok["sha256"]:
            raise DataError(
                f"{tok_file} does not match the tokenizer hash in the manifest: "
                f"re-run `{fixes.rebuild('shard')}`"
            )
        dtype = np.dtype(self.manifest["dtype"])
        self.sources: dict[str, Source] = {}
        for name, entry in self.manifest["streams"].items():
            maps: list[np.ndarray] = []
            for shard in entry["shards"]:
                path = self.root / shard["file"]
                if not path.is_file():
                    raise DataError(
                        f"shard {path} listed in the manifest is missing: re-run `{fixes.rebuild('shard')}`"
                    )
                if verify and sha256_file(path) != shard["sha256"]:
                    raise DataError(
                        f"shard {path} does not match the sha256 in the manifest (corrupted on disk?); "
                        f"restore it with `{fixes.restore(self.root)}` or rebuild with "
                        f"`{fixes.force_rebuild('shard')}`"
                    )
                maps.append(np.memmap(path, dtype=dtype, mode="r"))
            usable = [m for m in maps if len(m) > seq_len]
            if not usable:
                longest = max(len(m) for m in maps)
                raise DataError(
                    f"model.seq_len = {seq_len} is longer than every shard of {name} (longest: {longest} "
                    f"tokens); lower model.seq_len or raise shard.shard_tokens"
                )
            self.sources[name] = Source(name, usable, entry["n_bytes"], entry["n_tokens"])

    def documents(self, tier: str, row_len: int) -> Documents:
        """The documents of ``tier`` for packing rows of ``row_len`` tokens."""
        eot = self.manifest["tokenizer"].get("eot_id")
        if eot is None:
            raise DataError(
                f"{self.root / 'manifest.json'} does not say which token ends a document (eot_id), which "
                "pretrain.packing: bos_best_fit needs: re-run the shard stage "
                f"(`{fixes.force_rebuild('shard')}`)"
            )
        return Documents.index(self.sources[f"train/{tier}"], eot, row_len)

    def tiers(self) -> list[str]:
        return sorted(n.split("/", 1)[1] for n in self.sources if n.startswith("train/"))

    def heldout(self) -> list[Source]:
        return [s for n, s in sorted(self.sources.items()) if n.startswith("heldout/")]


@dataclass(frozen=True)
class Documents:
    """A tier's documents: each an end-of-text token and what follows it up to the next one, one
    longer than a row in pieces of a row. A shard's tokens before its first end-of-text go on a
    document of the shard before: they are pieces of their own, so every token can be reached."""

    shard: np.ndarray  # index into Source.shards
    start: np.ndarray
    length: np.ndarray
    row_len: int

    @classmethod
    def index(cls, source: Source, eot: int, row_len: int) -> Documents:
        shard, start, length, found = [], [], [], False
        for i, tokens in enumerate(source.shards):
            at = np.union1d([0], np.flatnonzero(np.asarray(tokens) == eot))
            found = found or len(at) > 1 or tokens[0] == eot
            whole = np.diff(np.append(at, len(tokens)))
            pieces = -(-whole // row_len)  # rows a document fills
            first = np.repeat(np.cumsum(pieces) - pieces, pieces)
            offset = (np.arange(pieces.sum()) - first) * row_len  # of each piece in its document
            shard.append(np.full(pieces.sum(), i))
            start.append(np.repeat(at, pieces) + offset)
            length.append(np.minimum(np.repeat(whole, pieces) - offset, row_len))
        shard_of, start_of, length_of = (np.concatenate(a).astype(np.int64) for a in (shard, start, length))
        docs = cls(shard_of, start_of, length_of, row_len)
        if not found:
            raise DataError(
                f"{source.name} holds no end-of-text token, so no document starts in its shards: "
                "pretrain.packing: bos_best_fit packs whole documents; set pretrain.packing: windows"
            )
        return docs

    def pack(self, shards: list[np.ndarray], n_rows: int, rng: np.random.Generator) -> np.ndarray:
        """``n_rows`` rows of ``row_len`` tokens, each whole documents (or pieces) from its start,
        best fit."""
        out = np.empty((n_rows, self.row_len), dtype=np.int64)
        # Pieces are drawn alike, so a long document is drawn as often as its tokens would be.
        pool = rng.integers(0, len(self.start), size=POOL_PER_ROW * n_rows)
        lengths = self.length[pool].astype(np.float64)  # inf marks a document already packed
        for row in range(n_rows):
            at = 0
            while at < self.row_len:
                if np.isinf(lengths).all():  # the pool is spent: draw more
                    pool = rng.integers(0, len(self.start), size=POOL_PER_ROW * n_rows)
                    lengths = self.length[pool].astype(np.float64)
                room = self.row_len - at
                fits = np.where(lengths <= room, lengths, -1)
                pick = int(fits.argmax()) if fits.max() > 0 else int(lengths.argmin())
                doc, take = pool[pick], int(min(lengths[pick], room))
                start = self.start[doc]
                out[row, at : at + take] = shards[self.shard[doc]][start : start + take]
                at += take
                lengths[pick] = np.inf
        return out


class TrainStream:
    """Training rows of ``seq_len + 1`` tokens drawn from a weighted mix of tiers: windows, or
    packed documents (``packing``)."""

    def __init__(self, shards: ShardSet, seq_len: int, data_seed: int, packing: str = "windows"):
        self.shards, self.seq_len, self.data_seed = shards, seq_len, data_seed
        self.packing = packing
        self.step = 0  # the data position: the next step whose batch will be drawn
        self._documents: dict[str, Documents] = {}  # per tier, indexed when first drawn from

    def documents(self, tier: str) -> Documents:
        if tier not in self._documents:
            self._documents[tier] = self.shards.documents(tier, self.seq_len + 1)
        return self._documents[tier]

    def state_dict(self) -> dict[str, int]:
        return {"data_seed": self.data_seed, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.data_seed, self.step = int(state["data_seed"]), int(state["step"])

    def _picks(
        self, step: int, batch_size: int, mix: dict[str, float]
    ) -> tuple[list[str], np.ndarray, np.random.Generator]:
        """The tier of each window of ``step`` (the first draw of the step's generator)."""
        tiers = sorted(t for t, w in mix.items() if w > 0)
        for t in tiers:
            if f"train/{t}" not in self.shards.sources:
                raise DataError(f"data mix names tier {t!r} but the shards hold {self.shards.tiers()}")
        weights = np.array([mix[t] for t in tiers], dtype=np.float64)
        rng = np.random.default_rng([self.data_seed, step])
        return tiers, rng.choice(len(tiers), size=batch_size, p=weights / weights.sum()), rng

    def tokens_per_tier(
        self, steps: range, rows_at: Callable[[int], int], mix_at: Callable[[int], dict[str, float]]
    ) -> dict[str, dict[str, float]]:
        """Tokens the steps in ``steps`` draw from each tier (``rows_at(step)`` and ``mix_at(step)``
        are that step's sequences and mix), and the tier's size in epochs. Replays the tier draws
        only, so it costs microseconds a step."""
        counts: dict[str, int] = {}
        for step in steps:
            tiers, picks, _ = self._picks(step, rows_at(step), mix_at(step))
            for i, tier in enumerate(tiers):
                counts[tier] = counts.get(tier, 0) + int((picks == i).sum()) * self.seq_len
        out = {}
        for tier in sorted(counts):
            size = self.shards.sources[f"train/{tier}"].n_tokens
            out[tier] = {"tokens": counts[tier], "tier_tokens": size, "epochs": counts[tier] / max(size, 1)}
        return out

    def global_batch(self, step: int, batch_size: int, mix: dict[str, float]) -> np.ndarray:
        """The ``batch_size`` windows of ``step``, identical on every rank: (B, seq_len + 1) int64."""
        tiers, picks, rng = self._picks(step, batch_size, mix)
        out = np.empty((batch_size, self.seq_len + 1), dtype=np.int64)
        for ti, tier in enumerate(tiers):
            rows = np.flatnonzero(picks == ti)
            if not len(rows):
                continue
            shards = self.shards.sources[f"train/{tier}"].shards
            if self.packing == "bos_best_fit":
                out[rows] = self.documents(tier).pack(shards, len(rows), rng)
                continue
            starts_per_shard = np.array([len(s) - self.seq_len for s in shards], dtype=np.int64)
            shard_ids = rng.choice(len(shards), size=len(rows), p=starts_per_shard / starts_per_shard.sum())
            starts = rng.integers(0, starts_per_shard[shard_ids])
            for row, si, start in zip(rows, shard_ids, starts, strict=True):
                out[row] = shards[si][start : start + self.seq_len + 1]
        return out

    def next_batches(
        self,
        batch_size: int,
        mix: dict[str, float],
        rank: int,
        world: int,
        micro_batch: int,
        device: torch.device,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches (inputs, targets) for the current step; advances the position."""
        windows = self.global_batch(self.step, batch_size, mix)
        self.step += 1
        mine = windows[rank::world]  # disjoint across ranks, equal to one process when world = 1
        out = []
        for i in range(0, len(mine), micro_batch):
            w = torch.from_numpy(mine[i : i + micro_batch])
            if device.type == "cuda":
                w = w.pin_memory().to(device, non_blocking=True)
            out.append((w[:, :-1], w[:, 1:]))
        return out


def eval_windows(source: Source, seq_len: int, n_windows: int) -> np.ndarray:
    """Fixed, evenly spaced, non-overlapping windows of one held-out source (the same at every eval)."""
    starts = []
    for si, shard in enumerate(source.shards):
        for off in range(0, len(shard) - seq_len - 1 + 1, seq_len + 1):
            starts.append((si, off))
    if not starts:
        raise DataError(f"held-out source {source.name} is shorter than one window of {seq_len + 1} tokens")
    picks = np.linspace(0, len(starts) - 1, num=min(n_windows, len(starts))).round().astype(int)
    return np.stack(
        [source.shards[starts[p][0]][starts[p][1] : starts[p][1] + seq_len + 1] for p in picks]
    ).astype(np.int64)
