"""Newton-Schulz orthogonalisation on one process: Muon's update made (nearly) orthogonal.

torch.optim.Muon's arithmetic, with the matrices of one shape batched into one matmul; on a CPU
without bf16 instructions its bf16 products run in fp32, rounded at the same points
(``_step_in_fp32``). The Polar Express coefficients are the alternative ``muon_orthogonaliser``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from lehr.engine.hardware import cpu_has_bf16

# Newton-Schulz quintic coefficients and steps of torch.optim.Muon (Keller Jordan's).
NS_COEFFICIENTS, NS_STEPS, NS_EPS = (3.4445, -4.775, 2.0315), 5, 1e-7


@dataclass(frozen=True)
class Orthogonaliser:
    """An odd quintic iteration X <- a X + (b A + c A^2) X, A = X X^T, from X / (norm_scale * ||X||_F)."""

    steps: tuple[tuple[float, float, float], ...]  # (a, b, c) of each iteration
    norm_scale: float  # above 1: a margin for the spectral norm to start below 1


OrthogonaliserName = Literal["newton_schulz", "polar_express"]  # muon_orthogonaliser's values

ORTHOGONALISERS: dict[OrthogonaliserName, Orthogonaliser] = {
    "newton_schulz": Orthogonaliser((NS_COEFFICIENTS,) * NS_STEPS, 1.0),  # torch.optim.Muon's
    # Polar Express (Amsel et al. 2025, arXiv 2505.16932): coefficients fitted for each of the 5
    # iterations, as nanochat computes them (safety factor 2e-2, cushion 2), and its 1.01 margin.
    "polar_express": Orthogonaliser(
        (
            (8.156554524902461, -22.48329292557795, 15.878769915207462),
            (4.042929935166739, -2.808917465908714, 0.5000178451051316),
            (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
            (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
            (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
        ),
        1.01,
    ),
}


def _step(x: torch.Tensor, a: float, b: float, c: float) -> torch.Tensor:
    """One iteration in bf16, as torch.optim.Muon computes it."""
    gram = x @ x.mT
    return torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)


def _step_in_fp32(x: torch.Tensor, a: float, b: float, c: float) -> torch.Tensor:
    """``_step`` on a CPU without bf16 instructions, where torch multiplies bf16 matrices in scalar
    loops ten times slower than fp32 ones (a 2-core AVX2 EPYC; ``bench/newton_schulz.py``): the
    same products in fp32, each result rounded to bf16 where the bf16 kernels round theirs (a
    matmul's sum in fp32, then ``beta * C + alpha * sum`` in fp32, then bf16), so the iterate stays
    bf16's. Only the fp32 sums' order is the fp32 kernel's: on that CPU about one element in 10^4
    rounds one bf16 step apart from the bf16 kernel's, as two CPUs' kernels do."""
    xf = x.float()
    gram = (xf @ xf.mT).bfloat16().float()
    inner = (b * gram + c * (gram @ gram)).bfloat16().float()
    return (a * xf + inner @ xf).bfloat16()


def orthogonalise(
    matrices: Sequence[torch.Tensor], method: Orthogonaliser = ORTHOGONALISERS["newton_schulz"]
) -> list[torch.Tensor]:
    """Each matrix orthogonalised by ``method`` (by default torch.optim.Muon's Newton-Schulz, within
    bf16 rounding: ``_step_in_fp32``), with the matrices of one shape (a tall one transposed to
    wide) stacked into one batched matmul, because a CPU runs a few large matmuls much faster than
    many small ones (``bench/newton_schulz.py``)."""
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, m in enumerate(matrices):
        by_shape.setdefault((min(m.shape), max(m.shape)), []).append(i)
    out: dict[int, torch.Tensor] = {}  # by index: the groups of shapes together cover every matrix
    for index in by_shape.values():
        tall = [matrices[i].size(0) > matrices[i].size(1) for i in index]
        x = torch.stack(
            [m.mT if t else m for m, t in zip((matrices[i] for i in index), tall, strict=True)]
        ).bfloat16()
        norm = x.norm(dim=(-2, -1), keepdim=True)
        if method.norm_scale != 1:
            norm = norm * method.norm_scale
        x = x / norm.clamp(min=NS_EPS)  # spectral norm <= 1
        step = _step_in_fp32 if x.device.type == "cpu" and not cpu_has_bf16() else _step
        for a, b, c in method.steps:
            x = step(x, a, b, c)
        for i, t, y in zip(index, tall, x.unbind(), strict=True):
            out[i] = y.mT if t else y
    return [out[i] for i in range(len(matrices))]
