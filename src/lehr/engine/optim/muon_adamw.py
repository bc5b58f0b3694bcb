"""``MuonAdamW``: Muon on the hidden matrices and fused AdamW on the rest, in one optimizer.

Muon's step is torch's arithmetic and LR scaling, with the orthogonalisation batched over
matrices of one shape, and every change to a parameter or its momentum selected on ``found_inf``:
a skipped step leaves both untouched, a taken one is torch's step (bit for bit where the batched
matmuls round as torch's one-matrix ones do), and no host sync decides it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast, overload

import torch
import torch.distributed as dist
from torch.optim import adamw
from torch.optim._muon import _adjust_lr

from lehr.engine.optim.muon_work import (
    is_dtensor,
    local_shard,
    orthogonalise_sharded,
    orthogonalise_shared,
    owners,
)
from lehr.engine.optim.newton_schulz import ORTHOGONALISERS, Orthogonaliser, orthogonalise

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


class MuonAdamW(torch.optim.Optimizer):
    """Muon on the groups marked ``algorithm: muon``, fused AdamW on the others, in one optimizer:
    one state dict (keyed by parameter name in checkpoints, like AdamW's), one ``found_inf``."""

    # GradScaler hands a fp16 run's found_inf and scale to the step, as it does to fused AdamW.
    _step_supports_amp_scaling = True

    def __init__(
        self,
        groups: list[dict[str, Any]],
        *,
        lr: float,
        betas: tuple[float, float],
        momentum: float,
        shared: bool = True,
        orthogonaliser: Orthogonaliser = ORTHOGONALISERS["newton_schulz"],
        cautious_decay: bool = False,
        normuon_beta2: float = 0.0,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": 1e-8, "momentum": momentum, "lr_scale": 1.0}
        super().__init__(groups, defaults)
        # Attributes, not group entries: the config that built the optimizer holds them, and a
        # state dict without them is the same file whether they exist or not.
        self.shared, self.orthogonaliser, self.cautious_decay = shared, orthogonaliser, cautious_decay
        self.normuon_beta2 = normuon_beta2
        for group in self.param_groups:
            if group["algorithm"] == "muon" and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon takes 2-D matrices only")

    # torch.optim.Optimizer's two signatures: with a closure, the step evaluates the loss first
    # and returns it (the loop passes none).
    @overload
    def step(self, closure: None = None) -> None: ...
    @overload
    def step(self, closure: Callable[[], float]) -> float: ...
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
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
        return loss

    def _adamw(
        self,
        group: dict[str, Any],
        params: list[torch.Tensor],
        found_inf: torch.Tensor | None,
        grad_scale: torch.Tensor | None,
    ) -> None:
        states = [self.state[p] for p in params]
        for p, s in zip(params, states, strict=True):
            if not s:
                s["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                s["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                s["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        beta1, beta2 = group["betas"]
        adamw.adamw(
            params,
            [_grad(p) for p in params],
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

    def _muon(
        self,
        group: dict[str, Any],
        params: list[torch.Tensor],
        found_inf: torch.Tensor | None,
        grad_scale: torch.Tensor | None,
    ) -> None:
        lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
        # On a skipped step (found_inf = 1) every factor below is the identity; otherwise each is
        # the very scalar torch.optim.Muon uses, so the two step alike bit for bit.
        take = None if found_inf is None else found_inf == 0  # False on a skipped step
        for p in params:  # a DTensor under FSDP, so that the state dict shards it like the weights
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(
                    _grad(p), memory_format=torch.preserve_format
                )
        # The arithmetic runs on this rank's shards (the whole tensors outside FSDP).
        grads = [
            local_shard(_grad(p)) if grad_scale is None else local_shard(_grad(p)) / grad_scale
            for p in params
        ]
        bufs = [local_shard(self.state[p]["momentum_buffer"]) for p in params]
        if take is None:
            torch._foreach_lerp_(bufs, grads, 1 - momentum)
        else:  # a non-finite gradient must not reach the momentum, even times 0
            grads = [torch.where(take, g, torch.zeros_like(g)) for g in grads]
            for buf, new in zip(bufs, torch._foreach_lerp(bufs, grads, 1 - momentum), strict=True):
                buf.copy_(torch.where(take, new, buf))
        nesterov = torch._foreach_lerp(grads, bufs, momentum)
        method = self.orthogonaliser
        if is_dtensor(params[0]):
            world = params[0].device_mesh.size()
            owner = owners([p.shape for p in params], world) if self.shared else None
            # Under FSDP every hidden matrix is a DTensor: fully_shard shards them all.
            updates = orthogonalise_sharded(nesterov, cast("list[DTensor]", params), owner, method)
        else:
            updates = (
                orthogonalise_shared(nesterov, method) if self.shared else orthogonalise(nesterov, method)
            )
        if self.normuon_beta2:
            updates = self._even_out_neurons(params, updates, take)
        for p, update in zip(params, updates, strict=True):
            if take is not None:
                update = torch.where(take, update, torch.zeros_like(update))
            weight = local_shard(p)
            if self.cautious_decay:
                # Cautious weight decay (Chen et al. 2025, arXiv 2510.12402; nanochat): decay only
                # where the update moves the weight toward zero too, never against the update.
                agree = (update * weight) >= 0
                weight.sub_(weight * (agree if take is None else agree & take), alpha=lr * decay)
            else:
                weight.mul_(torch.where(take, 1 - lr * decay, 1.0) if take is not None else 1 - lr * decay)
            # Keller's sqrt(max(1, rows / cols)), of the whole matrix (a DTensor's shape is global)
            weight.add_(update, alpha=-_adjust_lr(lr, None, p.shape))

    def _even_out_neurons(
        self, params: list[torch.Tensor], updates: list[torch.Tensor], take: torch.Tensor | None
    ) -> list[torch.Tensor]:
        """NorMuon (Li et al. 2025, arXiv 2510.05491; nanochat): each neuron's row of the
        orthogonalised update divided by the root of a running mean (``normuon_beta2``) of its
        mean square, then the whole update scaled back to its norm before, so that Muon's step
        keeps its size while no neuron's share of it stays out of proportion. A row is an output
        neuron of an ``nn.Linear`` weight (out x in). Under FSDP a rank holds whole rows
        (``check_layout``), so only the two norms of each matrix cross processes, in one all-reduce."""
        beta2, evened, norms = self.normuon_beta2, [], []
        for p, update in zip(params, updates, strict=True):
            state = self.state[p]
            if "neuron_second_moment" not in state:
                state["neuron_second_moment"] = _rows_like(p)
            moment, update = local_shard(state["neuron_second_moment"]), update.float()
            new = torch.lerp(moment, update.square().mean(dim=-1, keepdim=True), 1 - beta2)
            moment.copy_(new if take is None else torch.where(take, new, moment))
            scaled = update / (moment.sqrt() + 1e-10)
            evened.append(scaled)
            norms.append(torch.stack([update.square().sum(), scaled.square().sum()]))
        sums = torch.stack(norms)
        if is_dtensor(params[0]) and params[0].device_mesh.size() > 1:
            dist.all_reduce(sums, group=params[0].device_mesh.get_group())
        ratios = sums[:, 0].sqrt() / (sums[:, 1].sqrt() + 1e-10)
        return [scaled * ratio for scaled, ratio in zip(evened, ratios.unbind(), strict=True)]


def _grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None, "step hands the algorithms only parameters with a gradient"
    return p.grad


def _rows_like(p: torch.Tensor) -> torch.Tensor:
    """Zeros of one value per row of ``p``: (rows, 1), laid out over the processes as ``p``'s rows are."""
    if not is_dtensor(p):
        return torch.zeros(p.shape[0], 1, dtype=torch.float32, device=p.device)
    from torch.distributed.tensor import DTensor

    local = torch.zeros(p.to_local().shape[0], 1, dtype=torch.float32, device=p.device)
    shape = torch.Size((p.shape[0], 1))
    return DTensor.from_local(local, p.device_mesh, p.placements, shape=shape, stride=(1, 1))
