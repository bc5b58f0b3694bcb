"""Benchmark: Muon's Newton-Schulz orthogonalisation of a model's hidden matrices, one matrix at a
time (torch.optim.Muon's way) vs lehr's, which stacks the matrices of one shape into a batched
matmul (on a CPU without bf16 instructions, in fp32 products rounded to bf16 where the bf16
kernels round: ``optim.newton_schulz._step_in_fp32``). Prints the milliseconds per optimizer step of each and
their ratio; the two are the same orthogonalisation within bf16 rounding (tests/engine/test_optim.py).

With ``--processes N`` (gloo, one thread each, as N processes on N cores), per preset: one
process alone (every core), then under DDP every process orthogonalising every matrix
(redundant) against each its share and one all-gather (shared), and under FSDP (each process
holding row shards) every process gathering every matrix (redundant) against each matrix sent
whole to one owner by all-to-all and back as shards (shared), with owners balanced by cost
(``optim.owners``) and, to choose between them, owners in turn (matrix i on rank i mod N, the
order microsoft/dion batches them in). Before timing, the load of each assignment (the slowest
rank's Newton-Schulz cost over the mean) and the bf16 bytes each scheme sends per rank and step.
Ends with ``shared / redundant: 0.NNx`` (DDP, the median over the presets).

    python bench/newton_schulz.py [--preset cpu-demo] [--device cpu] [--processes 2] [--blocks K]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.optim._muon import _zeropower_via_newtonschulz

from lehr.engine.model import Transformer, preset
from lehr.engine.optim import is_hidden_matrix
from lehr.engine.optim.muon_work import orthogonalise_sharded, orthogonalise_shared, owners
from lehr.engine.optim.newton_schulz import NS_COEFFICIENTS, NS_EPS, NS_STEPS, orthogonalise


def per_matrix(matrices: list[torch.Tensor]) -> list[torch.Tensor]:
    return [_zeropower_via_newtonschulz(m, NS_COEFFICIENTS, NS_STEPS, NS_EPS) for m in matrices]


def ms_per_call(fn, matrices: list[torch.Tensor], device: torch.device, reps: int) -> float:
    fn(matrices)  # warm-up: kernels chosen, buffers allocated
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(matrices)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def hidden_matrices(
    name: str, vocab: int, device: torch.device, blocks: int | None = None
) -> list[torch.Tensor]:
    """The preset's attention and MLP matrices (of its first ``blocks`` blocks only, if given)."""
    cfg = preset(name, vocab)
    if blocks is not None:
        cfg = dataclasses.replace(cfg, n_layer=min(blocks, cfg.n_layer))
    with torch.device("meta"):
        shapes = [p.shape for n, p in Transformer(cfg).named_parameters() if is_hidden_matrix(n, p)]
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=generator).to(device) for s in shapes]


def in_turn(shapes: list[torch.Size], world: int) -> list[int]:
    return [i % world for i in range(len(shapes))]


ASSIGNMENTS = {"by cost": owners, "in turn": in_turn}


def balance(shapes: list[torch.Size], owner: list[int], world: int) -> float:
    """The slowest rank's Newton-Schulz cost over the mean (1.00: even)."""
    load = [0] * world
    for s, o in zip(shapes, owner, strict=True):
        load[o] += s.numel() * min(s)
    return max(load) / (sum(load) / world)


def bytes_sent(shapes: list[torch.Size], world: int) -> dict[str, float]:
    """bf16 bytes one rank sends per step (the mean over ranks) under each scheme."""
    total = sum(s.numel() for s in shapes)
    return {
        "DDP shared": 2 * total / world * (world - 1),  # its results, to every other rank
        "FSDP redundant": 2 * total / world * (world - 1),  # its shards, to every other rank
        "FSDP shared": 2 * 2 * total / world * (world - 1) / world,  # its shards there, results back
    }


def _worker(rank: int, world: int, port: int, jobs: list, reps: int, out) -> None:
    torch.set_num_threads(1)  # one core per process, as DDP on this many cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cpu = torch.device("cpu")
    mesh = init_device_mesh("cpu", (world,))
    for name, matrices in jobs:
        params = [distribute_tensor(m, mesh, [Shard(0)]) for m in matrices]
        parts = [p.to_local() for p in params]
        shapes = [m.shape for m in matrices]

        def sharded(owner, parts=parts, params=params):  # this job's, bound now
            return lambda _: orthogonalise_sharded(parts, params, owner)

        schemes = {
            "DDP redundant": orthogonalise,
            "DDP shared": orthogonalise_shared,
            "FSDP redundant": sharded(None),
            **{f"FSDP shared ({a})": sharded(f(shapes, world)) for a, f in ASSIGNMENTS.items()},
        }
        times = []
        for fn in schemes.values():
            dist.barrier()
            times.append(ms_per_call(fn, matrices, cpu, reps))
        slowest = torch.tensor(times)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step waits for its slowest process
        if rank == 0:
            out.put((name, dict(zip(schemes, slowest.tolist(), strict=True))))
    dist.destroy_process_group()


def across_processes(world: int, presets: list[str], vocab: int, reps: int, blocks: int | None) -> None:
    jobs = [(name, hidden_matrices(name, vocab, torch.device("cpu"), blocks)) for name in presets]
    part = f" (their first {blocks} blocks)" if blocks else ""
    print(
        f"matrices{part}; load = the slowest rank's Newton-Schulz cost over the mean, MB = bf16 sent per rank"
    )
    for name, matrices in jobs:
        shapes = [m.shape for m in matrices]
        for n in sorted({world, 8}):  # 8: a GPU node, where the assignment and the volume matter more
            loads = "  ".join(f"{a} {balance(shapes, f(shapes, n), n):.2f}" for a, f in ASSIGNMENTS.items())
            volume = "  ".join(f"{k} {v / 1e6:.1f}" for k, v in bytes_sent(shapes, n).items())
            print(f"{name:12s} {len(matrices):3d} matrices, {n} ranks  load: {loads}  MB: {volume}")
    alone = {name: ms_per_call(orthogonalise, m, torch.device("cpu"), reps) for name, m in jobs}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    out = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_worker, args=(world, port, jobs, reps, out), nprocs=world)
    print(
        f"ms per optimizer step: one process alone ({torch.get_num_threads()} threads); {world} processes "
        "(gloo, one thread each), the slowest one"
    )
    ratios: dict[str, list[float]] = {"DDP": [], "FSDP": []}
    for _ in presets:
        name, times = out.get()
        ratios["DDP"].append(times["DDP shared"] / times["DDP redundant"])
        ratios["FSDP"].append(times["FSDP shared (by cost)"] / times["FSDP redundant"])
        cells = "  ".join(f"{k} {v:8.1f}" for k, v in times.items())
        print(f"{name:12s} alone {alone[name]:8.1f}  {cells}")
    print(f"FSDP shared (by cost) / redundant: {statistics.median(ratios['FSDP']):.2f}x")
    print(f"shared / redundant: {statistics.median(ratios['DDP']):.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cpu-demo")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--shared-presets", default="cpu-demo,llama-350m", help="the models --processes times")
    p.add_argument("--blocks", type=int, help="with --processes: only each preset's first K blocks' matrices")
    args = p.parse_args()
    if args.processes > 1:
        across_processes(args.processes, args.shared_presets.split(","), args.vocab, args.reps, args.blocks)
        return
    device = torch.device(args.device)
    matrices = hidden_matrices(args.preset, args.vocab, device)
    shapes = sorted({tuple(m.shape) for m in matrices})
    one, batched = (ms_per_call(fn, matrices, device, args.reps) for fn in (per_matrix, orthogonalise))
    print(
        f"{args.preset}: {len(matrices)} hidden matrices of shapes {shapes}, {NS_STEPS} steps, bf16, {device}"
    )
    print(f"one matrix at a time (torch.optim.Muon)  {one:8.1f} ms per step")
    print(f"batched by shape (lehr)                  {batched:8.1f} ms per step")
    print(f"speed-up                                 {one / batched:8.2f}x")


if __name__ == "__main__":
    main()
