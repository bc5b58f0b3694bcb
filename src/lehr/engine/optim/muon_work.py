"""Muon's orthogonalisation spread over the processes of a DDP or FSDP run (``muon_work``).

Newton-Schulz needs whole matrices, once per optimizer step. On one process it runs on each
matrix; under DDP (``muon_work: shared``) each rank runs it on the matrices it owns and one
all-to-all hands every rank the results; under FSDP each rank's shards of a matrix go to the
matrix's owner in one all-to-all and the shards of the result come back in another. Owners are
balanced by cost (``owners``), and ``muon_work: redundant`` (every rank does every matrix) is kept
to compare against.
"""

from __future__ import annotations

import sys
import typing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, TypeGuard, cast

import torch
import torch.distributed as dist

from lehr.engine.optim.newton_schulz import ORTHOGONALISERS, Orthogonaliser, orthogonalise

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.tensor import DTensor, Shard

# How Muon's orthogonalisation is spread over the processes (DDP or FSDP): shared = each matrix
# is orthogonalised once, by the rank that owns it; redundant = every rank orthogonalises every
# matrix (the same update, N times the work).
MuonWork = Literal["shared", "redundant"]
MUON_WORK: tuple[MuonWork, ...] = typing.get_args(MuonWork)


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view: writing it writes the parameter); a tensor itself."""
    return t.to_local() if is_dtensor(t) else t


def is_dtensor(t: torch.Tensor) -> TypeGuard[DTensor]:
    """Whether ``t`` is a DTensor, without importing ``torch.distributed.tensor`` (half a second,
    sympy included): a process that has not imported it (FSDP does) holds none, and the processes
    that only read a config (a stage's launcher, evaluate) never pay for it."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def owners(shapes: list[torch.Size], world: int) -> list[int]:
    """The rank that orthogonalises each matrix: the largest first, each to the least loaded rank
    (Newton-Schulz costs about rows x cols x min(rows, cols) per iteration); the same on every rank."""
    load, out = [0] * world, [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda i: (-shapes[i].numel() * min(shapes[i]), i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        out[i], load[rank] = rank, load[rank] + shapes[i].numel() * min(shapes[i])
    return out


def orthogonalise_shared(
    matrices: Sequence[torch.Tensor], method: Orthogonaliser = ORTHOGONALISERS["newton_schulz"]
) -> list[torch.Tensor]:
    """``orthogonalise`` with the work split over the processes of a DDP run. Under DDP every rank
    holds the same momentum-updated gradients, so a result computed by its owner is the one every
    rank would have computed, bit for bit where a batched matmul does not depend on the batch's
    other members (the CPU's; a test compares); one all-to-all hands each owner's bf16 results to
    every other rank (gloo moves an all-to-all several times faster than an all-gather of the
    same bytes: ``bench/newton_schulz.py`` measures this scheme)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return orthogonalise(matrices, method)
    world, rank = dist.get_world_size(), dist.get_rank()
    owner = owners([m.shape for m in matrices], world)
    computes = [[i for i, o in enumerate(owner) if o == k] for k in range(world)]
    done = orthogonalise([matrices[i] for i in computes[rank]], method) if computes[rank] else []
    got = _exchange(
        [[] if k == rank else done for k in range(world)],
        [[] if k == rank else [matrices[i].shape for i in computes[k]] for k in range(world)],
        None,
        matrices[0].device,
    )
    got[rank] = done
    out: dict[int, torch.Tensor] = {}  # by matrix: the lists computes[k] name each matrix once
    for k in range(world):
        for i, y in zip(computes[k], got[k], strict=True):
            out[i] = y
    return [out[i] for i in range(len(matrices))]


def check_layout(named: list[tuple[str, torch.Tensor]], whole_rows: bool = False) -> None:
    """Muon under FSDP gathers matrices sharded along one of their dimensions over a 1-D mesh
    (``fully_shard``'s layout, on any dimension; NorMuon's, ``whole_rows``, along the rows only, so
    that each rank holds its neurons' whole rows); refuses every other layout before any work."""
    sharded = [(name, p) for name, p in named if is_dtensor(p)]
    if not sharded:
        return
    from torch.distributed.tensor import Shard

    meshes = {p.device_mesh for _, p in sharded}
    for name, p in sharded:
        if len(meshes) > 1 or p.device_mesh.ndim != 1 or type(p.placements[0]) is not Shard:
            raise ValueError(
                f"Muon cannot gather {name}: it is laid out as {p.placements} over a "
                f"{p.device_mesh.ndim}-D process mesh, and Muon under FSDP takes the hidden matrices "
                "sharded along one dimension over one 1-D mesh (fully_shard's layout). Shard them so, "
                "or set pretrain.optimizer: adamw for this layout."
            )
        if whole_rows and p.placements[0].dim != 0:
            raise ValueError(
                f"pretrain.muon_normuon_beta2 needs each process to hold whole rows of {name}, which is "
                f"sharded along dimension {p.placements[0].dim}: shard it along its rows (fully_shard's "
                "default), or set pretrain.muon_normuon_beta2: 0"
            )


def orthogonalise_sharded(
    parts: Sequence[torch.Tensor],
    params: Sequence[DTensor],
    owner: list[int] | None,
    method: Orthogonaliser = ORTHOGONALISERS["newton_schulz"],
) -> list[torch.Tensor]:
    """``orthogonalise`` of matrices FSDP shards (checked by ``check_layout``). ``parts`` are this
    rank's shards of ``params``' momentum-updated gradients; returns this rank's shards of their
    updates. With ``owner`` (each matrix's rank, e.g. ``owners``) one all-to-all hands every shard
    of a matrix to its owner, which orthogonalises it whole, once, and a second hands each rank
    its shard of the result; without, one all-to-all hands every rank every shard and each
    orthogonalises everything. Both send bf16, the precision Newton-Schulz starts from, so
    neither rounds anything twice."""
    mesh = params[0].device_mesh
    world, rank, group = mesh.size(), mesh.get_local_rank(), mesh.get_group()
    if world == 1:
        return orthogonalise(parts, method)
    dims = [cast("Shard", p.placements[0]).dim for p in params]  # check_layout let only Shard through
    spans = [_spans(p.shape[d], world) for p, d in zip(params, dims, strict=True)]

    def shard(i: int, k: int) -> torch.Size:  # the shape of rank k's shard of matrix i
        return torch.Size(n if d != dims[i] else spans[i][k][1] for d, n in enumerate(params[i].shape))

    for i, part in enumerate(parts):
        if part.shape != shard(i, rank):
            raise RuntimeError(
                f"a shard of shape {tuple(part.shape)}, not torch.chunk's {tuple(shard(i, rank))}"
            )
    computes = [[i for i in range(len(params)) if owner is None or owner[i] == k] for k in range(world)]
    mine = computes[rank]
    got = _exchange(
        [[parts[i] for i in computes[k]] for k in range(world)],
        [[shard(i, k) for i in mine] for k in range(world)],
        group,
        parts[0].device,
    )
    whole = orthogonalise(
        [torch.cat([got[k][j] for k in range(world)], dims[i]) for j, i in enumerate(mine)], method
    )
    if owner is None:
        return [y.narrow(dims[i], *spans[i][rank]) for i, y in enumerate(whole)]
    back = _exchange(
        [[y.narrow(dims[i], *spans[i][k]) for i, y in zip(mine, whole, strict=True)] for k in range(world)],
        [[shard(i, rank) for i in computes[k]] for k in range(world)],
        group,
        parts[0].device,
    )
    out: dict[int, torch.Tensor] = {}  # by matrix: the lists computes[k] name each matrix once
    for k in range(world):
        for i, y in zip(computes[k], back[k], strict=True):
            out[i] = y
    return [out[i] for i in range(len(params))]


def _spans(n: int, world: int) -> list[tuple[int, int]]:
    """(start, length) of each rank's shard of a dimension of n, as torch.chunk (and FSDP2) splits it."""
    step = -(-n // world)
    return [(min(n, k * step), max(0, min(n, (k + 1) * step) - k * step)) for k in range(world)]


def _exchange(
    send: list[list[torch.Tensor]],
    shapes: list[list[torch.Size]],
    group: ProcessGroup | None,
    device: torch.device,
) -> list[list[torch.Tensor]]:
    """One all-to-all in bf16: ``send[k]`` goes to rank k; returns, for each rank k, the tensors
    it sent this one, in the ``shapes[k]`` this rank expects."""
    flat = [t.bfloat16().reshape(-1) for ts in send for t in ts]
    outgoing = torch.cat(flat) if flat else torch.empty(0, dtype=torch.bfloat16, device=device)
    incoming = torch.empty(sum(s.numel() for ss in shapes for s in ss), dtype=torch.bfloat16, device=device)
    dist.all_to_all_single(
        incoming,
        outgoing,
        [sum(s.numel() for s in ss) for ss in shapes],
        [sum(t.numel() for t in ts) for ts in send],
        group=group,
    )
    pieces = iter(incoming.split([s.numel() for ss in shapes for s in ss]))
    return [[next(pieces).view(s) for s in ss] for ss in shapes]
