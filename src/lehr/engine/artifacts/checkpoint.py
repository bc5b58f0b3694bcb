"""Checkpoints: directories written atomically, verified on load, resumed exactly.

A checkpoint directory holds ``model.safetensors``, ``optimizer.pt`` (optimizer + grad scaler),
``rng_rank<r>.pt`` (python, numpy, torch CPU and CUDA generators of rank r) and ``state.json``
(step, tokens, data position, config and its hash, data hashes, eval history, and the sha256
of every other file). It is written into a temporary sibling, fsynced and renamed; the
``latest`` pointer moves only after that. Tensors are loaded with ``weights_only=True``, so a
checkpoint can never run code.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from lehr import fixes
from lehr.engine.artifacts.state import STATE, STATE_SHA
from lehr.errors import Explained
from lehr.errors.messages import no_room
from lehr.files.atomic import (
    as_umask_allows,
    new_staging,
    recover,
    replace_dir,
    sha256_file,
    sibling,
    write_text_atomic,
)

log = logging.getLogger(__name__)
FORMAT = 2  # 2: state.json carries a checksum beside it


class CheckpointError(RuntimeError, Explained):
    """A checkpoint that cannot be written or trusted; the message says what to do."""


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def seed_all(seed: int) -> None:
    """Seed every generator a checkpoint saves (python, numpy, torch CPU and CUDA), so that a fresh
    run's saved states, like its weights, follow from the config alone."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)  # the legacy state of the global generator, MT19937's
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def write(
    target: Path,
    *,
    model: torch.nn.Module,
    optimizer_state: dict[str, Any],
    state: dict[str, Any],
    rng_per_rank: list[dict[str, Any]],
) -> Path:
    """Write a complete checkpoint at ``target``, replacing any old one only once it is whole."""
    with written_or_nothing(target):
        tmp = new_staging(target)
        save_model(model, str(tmp / "model.safetensors"))
        as_umask_allows(tmp / "model.safetensors")
        torch.save(optimizer_state, tmp / "optimizer.pt")
        commit(tmp, target, state, rng_per_rank)
    return target


def commit(tmp: Path, target: Path, state: dict[str, Any], rng_per_rank: list[dict[str, Any]]) -> None:
    """The second half of a write into ``files.atomic.new_staging(target)``, apart so that an
    async save can write its shards in between: add the RNG states and ``state.json`` (with the
    sha256 of every file, sharded ones in subfolders included), fsync it all and swap it in whole."""
    for rank, rng in enumerate(rng_per_rank):
        torch.save(rng, tmp / f"rng_rank{rank}.pt")
    files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
    for name in files:
        _fsync(tmp / name)
    state = {**state, "format": FORMAT, "files": {name: sha256_file(tmp / name) for name in files}}
    text = json.dumps(state, indent=1)
    (tmp / STATE).write_text(text)
    (tmp / STATE_SHA).write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
    for name in (STATE, STATE_SHA):
        _fsync(tmp / name)
    replace_dir(tmp, target)


@contextlib.contextmanager
def written_or_nothing(target: Path) -> Iterator[None]:
    """A checkpoint write that fails (a full disk…) leaves its staging folder removed, the previous
    checkpoint as it was, and a ``CheckpointError`` that says so."""
    try:
        yield
    # A full disk or a file-size limit reaches us as OSError from plain writes, RuntimeError from
    # torch's serializer ("unexpected pos") and SafetensorError from safetensors.
    except (OSError, RuntimeError, SafetensorError) as e:
        cause = no_room(e, staged=sibling(target, "tmp"))  # judged by what the write left, so first
        shutil.rmtree(sibling(target, "tmp"), ignore_errors=True)
        reason = cause or getattr(e, "strerror", None) or str(e).splitlines()[0][:200]
        raise CheckpointError(
            f"could not write {target}: {reason}. Nothing was replaced: the previous {target.name} in "
            f"{target.parent}, if there was one, is intact. "
            + ("Free space (or raise the limit)" if cause else "Free disk space (or fix permissions)")
            + " and run again."
        ) from e


def verify(path: Path) -> dict[str, Any]:
    """The checkpoint's state if every file is present and matches its sha256, else raise."""
    try:
        raw = (path / STATE).read_bytes()
        state: dict[str, Any] = json.loads(raw)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path / STATE} is unreadable ({e})") from None
    if (path / STATE_SHA).is_file():
        if (path / STATE_SHA).read_text().strip() != hashlib.sha256(raw).hexdigest():
            raise CheckpointError(
                f"{path / STATE} does not match its checksum in {STATE_SHA} (edited or corrupt)"
            )
    elif state.get("format", 1) >= 2:
        raise CheckpointError(f"{path / STATE_SHA} is missing: the checkpoint's state cannot be trusted")
    for name, digest in state.get("files", {}).items():
        f = path / name
        if not f.is_file() or sha256_file(f) != digest:
            raise CheckpointError(
                f"{f} is missing or does not match the sha256 in {path / STATE} (truncated, corrupt or "
                f"replaced): restore the checkpoint (`{fixes.restore(path)}`) or re-run the stage that "
                "made it"
            )
    return state


def load_weights(path: Path, model: torch.nn.Module) -> None:
    try:
        missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(
            f"{path / 'model.safetensors'} cannot be read ({str(e).splitlines()[0][:200]}): it is "
            f"truncated or not a safetensors file. Restore it (`{fixes.restore(path)}`, or export it again)."
        ) from None
    if missing or unexpected:
        raise CheckpointError(
            f"{path} holds weights of another model shape (missing {sorted(missing)[:3]}, unexpected "
            f"{sorted(unexpected)[:3]}): load it with the model config it was trained with"
        )


def load_optimizer(path: Path, device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path / "optimizer.pt", map_location=device, weights_only=True)
    return state


def load_rng(path: Path, rank: int) -> dict[str, Any] | None:
    f = path / f"rng_rank{rank}.pt"
    state: dict[str, Any] | None = torch.load(f, weights_only=True) if f.is_file() else None
    return state


class Rolling:
    """The rolling checkpoints of one run: ``<root>/step_<n>/`` and a ``latest`` pointer."""

    def __init__(self, root: str | Path, keep_last: int):
        self.root, self.keep_last = Path(root), max(1, keep_last)

    def candidates(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        steps = sorted((p for p in self.root.glob("step_*") if p.is_dir()), reverse=True)
        pointer = self.root / "latest"
        first = self.root / pointer.read_text().strip() if pointer.is_file() else None
        return ([first] if first in steps else []) + [p for p in steps if p != first]

    def recover(self) -> None:
        """Clear what a killed attempt left mid-write in the run folder, before anything reads it."""
        for folder in (self.root.parent, self.root):
            recover(folder)

    def path(self, step: int) -> Path:
        return self.root / f"step_{step:08d}"

    def save(self, step: int, **kwargs: Any) -> Path:
        return self.publish(write(self.path(step), **kwargs))

    def publish(self, path: Path) -> Path:
        """Point ``latest`` at a complete checkpoint, then drop those past ``keep_last``."""
        write_text_atomic(self.root / "latest", path.name)
        for old in self.candidates()[self.keep_last :]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    def latest_valid(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that verifies; warns about each broken one it skips."""
        found = self.candidates()
        for path in found:
            try:
                return path, verify(path)
            except CheckpointError as e:
                log.warning("skipping checkpoint %s: %s; falling back to the previous one", path, e)
        if found:
            raise CheckpointError(
                f"no valid checkpoint in {self.root} ({len(found)} found, all corrupt). Delete {self.root} "
                f"to start this run afresh."
            )
        return None


def resolve_start(rolling: Rolling, init_from: str | None) -> tuple[str, Path | None, dict[str, Any] | None]:
    """The one rule for where a run starts.

    Its own folder holds a checkpoint -> ``resume`` it; else a configured initial checkpoint
    (e.g. ``pre_anneal``) -> ``branch`` from it; else ``fresh``.
    """
    found = rolling.latest_valid()
    if found:
        return "resume", *found
    if init_from:
        path = Path(init_from)
        if not (path / STATE).is_file():
            raise CheckpointError(
                f"initial checkpoint {path} does not exist: run the pretrain_stable stage first "
                f"(`{fixes.rebuild('pretrain_stable')}` or `{fixes.run_stage('pretrain_stable')}`)"
            )
        return "branch", path, verify(path)
    return "fresh", None, None
