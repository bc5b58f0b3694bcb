"""The shard stream: deterministic training windows and fixed held-out windows.

Training windows are counter-based: the windows of step ``s`` come from a generator seeded with
``(data_seed, s)``, so the stream's whole state is the step it is at. A resumed run therefore
sees exactly the batches an uninterrupted run would, with nothing to replay. Every rank draws
the same global batch and keeps its own slice, so ranks see disjoint windows and N processes
see the same data as one process with the same global batch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lehr.files.atomic import sha256_file


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


def load_manifest(shard_dir: str | Path) -> dict:
    path = Path(shard_dir) / "manifest.json"
    if not path.is_file():
        raise DataError(f"{path} is missing: run the shard stage first (`dvc repro shard`)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path} is corrupt ({e}): rebuild it with `dvc repro --force shard`") from None


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
                f"{tok_file} does not match the tokenizer hash in the manifest: re-run `dvc repro shard`"
            )
        dtype = np.dtype(self.manifest["dtype"])
        self.sources: dict[str, Source] = {}
        for name, entry in self.manifest["streams"].items():
            maps = []
            for shard in entry["shards"]:
                path = self.root / shard["file"]
                if not path.is_file():
                    raise DataError(
                        f"shard {path} listed in the manifest is missing: re-run `dvc repro shard`"
                    )
                if verify and sha256_file(path) != shard["sha256"]:
                    raise DataError(
                        f"shard {path} does not match the sha256 in the manifest (corrupted on disk?); "
                        f"restore it with `dvc checkout` or rebuild with `dvc repro --force shard`"
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

    def tiers(self) -> list[str]:
        return sorted(n.split("/", 1)[1] for n in self.sources if n.startswith("train/"))

    def heldout(self) -> list[Source]:
        return [s for n, s in sorted(self.sources.items()) if n.startswith("heldout/")]


class TrainStream:
    """Training windows of ``seq_len + 1`` tokens drawn from a weighted mix of tiers."""

    def __init__(self, shards: ShardSet, seq_len: int, data_seed: int):
        self.shards, self.seq_len, self.data_seed = shards, seq_len, data_seed
        self.step = 0  # the data position: the next step whose batch will be drawn

    def state_dict(self) -> dict:
        return {"data_seed": self.data_seed, "step": self.step}

    def load_state_dict(self, state: dict) -> None:
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

    def tokens_per_tier(self, steps: range, batch_size: int, mix_at) -> dict[str, dict]:
        """Tokens the steps in ``steps`` draw from each tier (``mix_at(step)`` is that step's mix),
        and the tier's size in epochs. Replays the tier draws only, so it costs microseconds a step."""
        counts: dict[str, int] = {}
        for step in steps:
            tiers, picks, _ = self._picks(step, batch_size, mix_at(step))
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
            starts_per_shard = np.array([len(s) - self.seq_len for s in shards], dtype=np.int64)
            shard_ids = rng.choice(len(shards), size=len(rows), p=starts_per_shard / starts_per_shard.sum())
            starts = rng.integers(0, starts_per_shard[shard_ids])
            for row, si, start in zip(rows, shard_ids, starts):
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
