"""Benchmark: Muon's Newton-Schulz orthogonalisation of a model's hidden matrices, one matrix at a
time (torch.optim.Muon's way) vs lehr's, which stacks the matrices of one shape into a batched
matmul. Prints the milliseconds per optimizer step of each and their ratio; the two give the same
bits (tests/engine/test_optim.py). With ``--processes N`` (gloo, one thread each, as N DDP
processes on N cores), also every process orthogonalising every matrix (redundant) against each
its share and one all-gather (shared), side by side, ending with ``shared / redundant: 0.NNx``.

    python bench/newton_schulz.py [--preset cpu-demo] [--device cpu] [--processes 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.optim._muon import _zeropower_via_newtonschulz

from lehr.engine.model import Transformer, preset
from lehr.engine.optim import (
    NS_COEFFICIENTS,
    NS_EPS,
    NS_STEPS,
    is_hidden_matrix,
    orthogonalise,
    orthogonalise_shared,
)


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


def hidden_matrices(name: str, vocab: int, device: torch.device) -> list[torch.Tensor]:
    model = Transformer(preset(name, vocab))
    return [p.detach().to(device) for n, p in model.named_parameters() if is_hidden_matrix(n, p)]


def _worker(rank: int, world: int, port: int, presets: list[str], vocab: int, reps: int, out) -> None:
    torch.set_num_threads(1)  # one core per process, as DDP on this many cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cpu = torch.device("cpu")
    for name in presets:
        matrices = hidden_matrices(name, vocab, cpu)
        times = {}
        for label, fn in (("redundant", orthogonalise), ("shared", orthogonalise_shared)):
            dist.barrier()
            times[label] = ms_per_call(fn, matrices, cpu, reps)
        slowest = torch.tensor([times["redundant"], times["shared"]])
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step waits for its slowest process
        if rank == 0:
            out.put((name, len(matrices), *slowest.tolist()))
    dist.destroy_process_group()


def across_processes(world: int, presets: list[str], vocab: int, reps: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    out = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_worker, args=(world, port, presets, vocab, reps, out), nprocs=world)
    print(f"{world} processes (gloo, one thread each): ms per optimizer step of the slowest process")
    ratios = []
    for _ in presets:
        name, n, redundant, shared = out.get()
        ratios.append(shared / redundant)
        print(
            f"{name:12s} {n:3d} matrices  redundant {redundant:8.1f}  shared {shared:8.1f}  {ratios[-1]:.2f}x"
        )
    print(f"shared / redundant: {statistics.median(ratios):.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cpu-demo")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--shared-presets", default="cpu-demo,llama-350m", help="the models --processes times")
    args = p.parse_args()
    if args.processes > 1:
        across_processes(args.processes, args.shared_presets.split(","), args.vocab, args.reps)
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
