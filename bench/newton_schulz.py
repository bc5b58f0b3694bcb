"""Benchmark: Muon's Newton-Schulz orthogonalisation of a model's hidden matrices, one matrix at a
time (torch.optim.Muon's way) vs lehr's, which stacks the matrices of one shape into a batched
matmul. Prints the milliseconds per optimizer step of each and their ratio; the two give the same
bits (tests/engine/test_optim.py).

    python bench/newton_schulz.py [--preset cpu-demo] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.optim._muon import _zeropower_via_newtonschulz

from lehr.engine.model import Transformer, preset
from lehr.engine.optim import NS_COEFFICIENTS, NS_EPS, NS_STEPS, is_hidden_matrix, orthogonalise


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cpu-demo")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    device = torch.device(args.device)
    model = Transformer(preset(args.preset, args.vocab))
    matrices = [p.detach().to(device) for n, p in model.named_parameters() if is_hidden_matrix(n, p)]
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
