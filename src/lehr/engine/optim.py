"""The optimizers, and the one thing lehr asks of them: a step that skips itself on the device.

* ``adamw``: fused AdamW on every parameter (decay on matrices only).
* ``muon``: Muon (momentum, then Newton-Schulz orthogonalisation of the update) on the hidden
  matrices, the attention and MLP projections; AdamW on the embeddings, the output head and the
  norm gains, which Muon is not made for. Each group keeps its own LR and weight decay.

The non-finite guard and loss-spike skipping decide on the device (``run.guard``) and hand the
optimizer ``found_inf``; fused AdamW honours it inside its kernel. ``torch.optim.Muon`` has no
such input, so ``MuonAdamW`` applies Muon's step (torch's arithmetic and LR scaling, with the
orthogonalisation batched over matrices of one shape) with every change to a parameter or its
momentum selected on ``found_inf``: a skipped step leaves both untouched, a taken one is torch's
step bit for bit, and no host sync decides it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.optim import adamw
from torch.optim._muon import _adjust_lr

OPTIMIZERS = ("adamw", "muon")
# Newton-Schulz quintic coefficients and steps of torch.optim.Muon (Keller Jordan's).
NS_COEFFICIENTS, NS_STEPS, NS_EPS = (3.4445, -4.775, 2.0315), 5, 1e-7
# How Muon's orthogonalisation is spread over the processes of a DDP run: shared = each rank
# orthogonalises the matrices it owns and one all-gather hands every rank every result;
# redundant = every rank orthogonalises every matrix (the same update, N times the work).
MUON_WORK = ("shared", "redundant")
CALLS = [0]  # Muon steps that orthogonalised, in this process: one per optimizer step (a test counts)


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """A 2-D weight inside a block (attention or MLP projection): Muon's share."""
    return p.dim() == 2 and name.startswith("blocks.")


def build(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    """The optimizer ``cfg.optimizer`` names, over the model's trainable parameters."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    # Decay matrices only: norm gains are not capacity, and decaying them distorts normalisation.
    matrices = [
        p for n, p in named if p.dim() >= 2 and not (cfg.optimizer == "muon" and is_hidden_matrix(n, p))
    ]
    gains = [p for _, p in named if p.dim() < 2]
    adam_groups = [
        {"params": matrices, "weight_decay": cfg.weight_decay},
        {"params": gains, "weight_decay": 0.0},
    ]
    if cfg.optimizer == "adamw":
        # Fused on every device: one kernel per step, and it honours ``found_inf`` (see run/guard.py).
        return torch.optim.AdamW(adam_groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True)
    hidden = [p for n, p in named if is_hidden_matrix(n, p)]
    muon_group = {
        "params": hidden,
        "algorithm": "muon",
        "lr": cfg.muon_lr,
        "weight_decay": cfg.muon_weight_decay,
        "lr_scale": cfg.muon_lr / cfg.lr,  # the schedule's LR times this (``set_lr``)
    }
    return MuonAdamW(
        [muon_group, *({**g, "algorithm": "adamw"} for g in adam_groups)],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        momentum=cfg.muon_momentum,
        shared=cfg.muon_work == "shared",
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's LR for this step, scaled per group (Muon's peak is its own)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


class MuonAdamW(torch.optim.Optimizer):
    """Muon on the groups marked ``algorithm: muon``, fused AdamW on the others, in one optimizer:
    one state dict (keyed by parameter name in checkpoints, like AdamW's), one ``found_inf``."""

    # GradScaler hands a fp16 run's found_inf and scale to the step, as it does to fused AdamW.
    _step_supports_amp_scaling = True

    def __init__(
        self,
        groups: list[dict],
        *,
        lr: float,
        betas: tuple[float, float],
        momentum: float,
        shared: bool = True,
    ):
        defaults = {"lr": lr, "betas": betas, "eps": 1e-8, "momentum": momentum, "lr_scale": 1.0}
        super().__init__(groups, defaults)
        self.shared = shared
        for group in self.param_groups:
            if group["algorithm"] == "muon" and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon takes 2-D matrices only")

    @torch.no_grad()
    def step(self, closure=None):
        found_inf = getattr(self, "found_inf", None)
        grad_scale = getattr(self, "grad_scale", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if group["algorithm"] == "muon":
                self._muon(group, params, found_inf, grad_scale)
            else:
                self._adamw(group, params, found_inf, grad_scale)

    def _adamw(self, group: dict, params: list, found_inf, grad_scale) -> None:
        states = [self.state[p] for p in params]
        for p, s in zip(params, states):
            if not s:
                s["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                s["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                s["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        beta1, beta2 = group["betas"]
        adamw.adamw(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            fused=True,
            grad_scale=grad_scale,
            found_inf=found_inf,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )

    def _muon(self, group: dict, params: list, found_inf, grad_scale) -> None:
        lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
        # On a skipped step (found_inf = 1) every factor below is the identity; otherwise each is
        # the very scalar torch.optim.Muon uses, so the two step alike bit for bit.
        take = None if found_inf is None else found_inf == 0  # False on a skipped step
        grads = [p.grad if grad_scale is None else p.grad / grad_scale for p in params]
        for p, g in zip(params, grads):
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(g, memory_format=torch.preserve_format)
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        if take is None:
            torch._foreach_lerp_(bufs, grads, 1 - momentum)
        else:  # a non-finite gradient must not reach the momentum, even times 0
            grads = [torch.where(take, g, torch.zeros_like(g)) for g in grads]
            for buf, new in zip(bufs, torch._foreach_lerp(bufs, grads, 1 - momentum)):
                buf.copy_(torch.where(take, new, buf))
        nesterov = torch._foreach_lerp(grads, bufs, momentum)
        CALLS[0] += 1
        updates = orthogonalise_shared(nesterov) if self.shared else orthogonalise(nesterov)
        for p, update in zip(params, updates):
            if take is not None:
                update = torch.where(take, update, torch.zeros_like(update))
            p.mul_(torch.where(take, 1 - lr * decay, 1.0) if take is not None else 1 - lr * decay)
            p.add_(update, alpha=-_adjust_lr(lr, None, p.shape))  # Keller's sqrt(max(1, rows / cols))


def owners(shapes: list[torch.Size], world: int) -> list[int]:
    """The rank that orthogonalises each matrix: the largest first, each to the least loaded rank
    (Newton-Schulz costs about rows x cols x min(rows, cols) per iteration); the same on every rank."""
    load, out = [0] * world, [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda i: (-shapes[i].numel() * min(shapes[i]), i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        out[i], load[rank] = rank, load[rank] + shapes[i].numel() * min(shapes[i])
    return out


def orthogonalise_shared(matrices: list[torch.Tensor]) -> list[torch.Tensor]:
    """``orthogonalise`` with the work split over the processes of a DDP run. Under DDP every rank
    holds the same momentum-updated gradients, so a result computed by its owner is the one every
    rank would have computed, bit for bit where a batched matmul does not depend on the batch's
    other members (the CPU's; a test compares); one all-gather of bf16 results hands them round."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return orthogonalise(matrices)
    world, rank = dist.get_world_size(), dist.get_rank()
    owner = owners([m.shape for m in matrices], world)
    mine = [i for i, o in enumerate(owner) if o == rank]
    sizes = [sum(m.numel() for m, o in zip(matrices, owner) if o == r) for r in range(world)]
    flat = torch.zeros(max(sizes), dtype=torch.bfloat16, device=matrices[0].device)
    if mine:
        done = orthogonalise([matrices[i] for i in mine])
        flat[: sizes[rank]] = torch.cat([y.reshape(-1) for y in done])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    out: list[torch.Tensor] = [None] * len(matrices)  # type: ignore[list-item]
    offsets = [0] * world
    for i, (m, o) in enumerate(zip(matrices, owner)):
        out[i] = gathered[o][offsets[o] : offsets[o] + m.numel()].view(m.shape)
        offsets[o] += m.numel()
    return out


def orthogonalise(matrices: list[torch.Tensor]) -> list[torch.Tensor]:
    """torch.optim.Muon's Newton-Schulz orthogonalisation of each matrix, bit for bit, with the
    matrices of one shape (a tall one transposed to wide) stacked into one batched matmul, because
    a CPU runs a few large matmuls much faster than many small ones (``bench/newton_schulz.py``)."""
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, m in enumerate(matrices):
        by_shape.setdefault((min(m.shape), max(m.shape)), []).append(i)
    out: list[torch.Tensor] = [None] * len(matrices)  # type: ignore[list-item]
    for index in by_shape.values():
        tall = [matrices[i].size(0) > matrices[i].size(1) for i in index]
        x = torch.stack([m.mT if t else m for m, t in zip((matrices[i] for i in index), tall)]).bfloat16()
        x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=NS_EPS)  # spectral norm <= 1
        a, b, c = NS_COEFFICIENTS
        for _ in range(NS_STEPS):
            gram = x @ x.mT
            x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        for i, t, y in zip(index, tall, x.unbind()):
            out[i] = y.mT if t else y
    return out
