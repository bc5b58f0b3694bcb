"""Rolling checkpoints under FSDP: every rank writes its own shards through DCP
(``torch.distributed.checkpoint``) into the checkpoint's staging folder; rank 0 then commits it
as every checkpoint is committed (RNG states, the sha256 of every file, ``state.json``, one
rename, ``latest``, keep-K), so the atomic-folder and fallback guarantees hold as for a single
file. With ``async_save`` the shards are copied to host memory and written by a background
thread while training goes on; the next save, or the end of the run, waits for them and commits.
A kill before the commit leaves the staging folder (cleared at the next start) and the previous
checkpoint as it was.

DCP loads reshard: a checkpoint written by N processes resumes on M, sharded or not.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from lehr.engine.artifacts import checkpoint
from lehr.engine.processes import distributed, parallel
from lehr.files.atomic import new_staging

SHARDS = "dcp"  # the subfolder of a checkpoint that holds the DCP shards
SCALER = "scaler.pt"  # the grad scaler's state (rank 0's; every rank's is the same)


def is_sharded(path: Path) -> bool:
    return (path / SHARDS).is_dir()


@dataclass
class _InFlight:
    future: Future[Any]
    tmp: Path
    target: Path
    state: dict[str, Any] | None
    rngs: list[dict[str, Any]] | None


class ShardedSaves:
    def __init__(self, rolling: checkpoint.Rolling, d: distributed.Dist, async_save: bool):
        self.rolling, self.d, self.async_save = rolling, d, async_save
        self.in_flight: _InFlight | None = None
        self.group = None

    def save(
        self,
        step: int,
        shards: dict[str, Any],
        scaler: dict[str, Any],
        state: dict[str, Any] | None,
        rngs: list[dict[str, Any]] | None,
    ) -> Path:
        """Every rank calls this; ``state`` and ``rngs`` matter on rank 0 only."""
        self.wait()
        if self.group is None and dist.is_initialized():
            # DCP plans a save with collectives; an async save runs them from a background thread,
            # so they get a gloo group of their own, apart from the training's (every rank makes
            # it here, at the same save).
            self.group = dist.new_group(backend="gloo")
        target = self.rolling.path(step)
        staged = None  # rank 0's staging folder, which every rank writes its shards into
        if self.d.is_main:
            with checkpoint.written_or_nothing(target):
                tmp = new_staging(target)
                torch.save(scaler, tmp / SCALER)
                staged = str(tmp)
        tmp = Path(cast(str, distributed.broadcast_object(staged, self.d)))  # rank 0's, on every rank
        if self.async_save:
            future = dcp.async_save(shards, checkpoint_id=tmp / SHARDS, process_group=self.group)
            assert isinstance(future, Future)  # staged before it returns (no async stager): one Future
            self.in_flight = _InFlight(future, tmp, target, state, rngs)
        else:
            dcp.save(shards, checkpoint_id=tmp / SHARDS, process_group=self.group)
            self._commit(tmp, target, state, rngs)
        return target

    def wait(self) -> None:
        """Finish the save in flight, if any: its shards on disk on every rank, then committed."""
        if self.in_flight is None:
            return
        flight, self.in_flight = self.in_flight, None
        flight.future.result()
        self._commit(flight.tmp, flight.target, flight.state, flight.rngs)

    def _commit(
        self, tmp: Path, target: Path, state: dict[str, Any] | None, rngs: list[dict[str, Any]] | None
    ) -> None:
        distributed.barrier(self.d)  # every rank's shards are written
        if self.d.is_main:
            assert state is not None and rngs is not None  # rank 0 is handed both (RunSaves.save)
            with checkpoint.written_or_nothing(target):
                checkpoint.commit(tmp, target, state, rngs)
            self.rolling.publish(target)
        distributed.barrier(self.d)


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """The model (and optimizer) from a sharded checkpoint, resharded to this run's processes."""
    saved = dcp.FileSystemReader(str(path / SHARDS)).read_metadata().state_dict_metadata
    state = parallel.sharded_state(model, optimizer)
    if optimizer is not None and _make_room(saved, model, optimizer):
        state = parallel.sharded_state(model, optimizer)
    if optimizer is not None:
        _leave_out_unsaved(saved, state["optimizer"]["state"])
    dcp.load(state, checkpoint_id=path / SHARDS)
    parallel.load_sharded_state(model, optimizer, state)


def _make_room(saved: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """DCP loads only what the state it is handed holds, and a fresh optimizer's state holds what
    its step makes: optimizer state of a parameter's shape that the checkpoint holds and the
    optimizer never makes itself (the tail's sums, ``run.tail``) gets a place first, as zeros of
    the parameter's layout. Returns whether any did."""
    params, made = dict(model.named_parameters()), False
    for key, meta in saved.items():
        fqn, _, name = key.removeprefix("optimizer.state.").rpartition(".")
        p = params.get(fqn) if key.startswith("optimizer.state.") else None
        if p is not None and name not in optimizer.state[p] and tuple(meta.size) == tuple(p.shape):
            optimizer.state[p][name] = torch.zeros_like(p, dtype=meta.properties.dtype)
            made = True
    return made


def _leave_out_unsaved(saved: dict[str, Any], per_param: dict[str, Any]) -> None:
    """Optimizer state the checkpoint does not hold (a branch that turns on an ingredient with
    state of its own, NorMuon's): left out of the load, so it starts from nothing, as on one process."""
    for fqn, entries in per_param.items():
        for name in [n for n in entries if f"optimizer.state.{fqn}.{n}" not in saved]:
            del entries[name]


def load_scaler(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path / SCALER, weights_only=True)
    return state
