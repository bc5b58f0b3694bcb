"""Process groups and the collectives the loop uses: gloo on CPU, NCCL on CUDA. The processes
themselves are started by ``launch``."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world: int
    host_group: object = None  # a gloo group for flags the hosts agree on; None: the default group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def setup(device: str, parallel: str = "ddp") -> Dist:
    backend = "nccl" if device != "cpu" and torch.cuda.is_available() else "gloo"
    if "RANK" not in os.environ:
        if parallel == "fsdp":  # FSDP2 shards over a process group, even a group of one
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return Dist(0, 0, 1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Rank 0 may spend minutes writing a large checkpoint while the others wait in a collective;
    # a short timeout would kill healthy runs on slow shared filesystems.
    timeout = datetime.timedelta(minutes=60)
    # After torchrun restarts a failed group, the store still holds the dead workers' addresses;
    # seen here: the new gloo group dialled them and failed. A prefix per restart keeps rounds apart.
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's own store
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=rank == 0 and not agent_hosts_store,
        timeout=timeout,
    )
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"lehr/restart{restart}", store),
        rank=rank,
        world_size=world,
        timeout=timeout,
    )
    # Agreeing on a host flag over NCCL would mean a device tensor and a device sync; over gloo it
    # is a few bytes between the hosts while the GPU queue keeps running.
    host_group = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
    return Dist(rank, int(os.environ.get("LOCAL_RANK", 0)), world, host_group)


def teardown(d: Dist) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def any_rank(flag: bool, d: Dist) -> bool:
    """True on every rank if ``flag`` is true on any: one tiny all-reduce between hosts, no device sync."""
    if not d.enabled:
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=d.host_group)
    return bool(t.item())


def mean_over_ranks(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """The mean of a scalar over the ranks, on the device (called at sync points only: a collective)."""
    if not d.enabled:
        return t
    total = t.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / d.world


_T = TypeVar("_T")


def broadcast_object(obj: _T, d: Dist) -> _T:
    if not d.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_to_main(obj: _T, d: Dist) -> list[_T] | None:
    if not d.enabled:
        return [obj]
    out: list[Any] | None = [None] * d.world if d.is_main else None  # gather_object fills in every obj
    dist.gather_object(obj, out, dst=0)
    return out


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()
