"""The optimizers, and the one thing lehr asks of them: a step that skips itself on the device.

* ``adamw``: fused AdamW on every parameter (decay on matrices only).
* ``muon``: Muon (momentum, then Newton-Schulz orthogonalisation of the update) on the hidden
  matrices, the attention and MLP projections; AdamW on the embeddings, the output head and the
  norm gains, which Muon is not made for. Each group keeps its own LR and weight decay.

The non-finite guard and loss-spike skipping decide on the device (``run.guard``) and hand the
optimizer ``found_inf``; fused AdamW honours it inside its kernel. ``torch.optim.Muon`` has no
such input, so ``muon_adamw.MuonAdamW`` applies Muon's step with every change to a parameter or
its momentum selected on ``found_inf``.

The rooms: ``muon_adamw`` (the optimizer of both algorithms), ``muon_work`` (Muon's
orthogonalisation spread over the processes of a DDP or FSDP run) and ``newton_schulz`` (the
orthogonalisation itself, on one process).
"""

from __future__ import annotations

import typing
from typing import Literal, Protocol

import torch

from lehr.engine.optim.muon_adamw import MuonAdamW
from lehr.engine.optim.muon_work import MuonWork, check_layout
from lehr.engine.optim.newton_schulz import ORTHOGONALISERS, OrthogonaliserName

Optimizer = Literal["adamw", "muon"]
OPTIMIZERS: tuple[Optimizer, ...] = typing.get_args(Optimizer)


class OptimizerSettings(Protocol):
    """What ``build`` reads of a run's settings (``config.OptimizerConfig`` and the schedule's peak):
    a protocol, so that the optimizers need not import the config, which imports their names."""

    @property
    def optimizer(self) -> Optimizer: ...
    @property
    def lr(self) -> float: ...
    @property
    def beta1(self) -> float: ...
    @property
    def beta2(self) -> float: ...
    @property
    def weight_decay(self) -> float: ...
    @property
    def muon_lr(self) -> float: ...
    @property
    def muon_momentum(self) -> float: ...
    @property
    def muon_weight_decay(self) -> float: ...
    @property
    def muon_work(self) -> MuonWork: ...
    @property
    def muon_orthogonaliser(self) -> OrthogonaliserName: ...
    @property
    def muon_cautious_decay(self) -> bool: ...
    @property
    def muon_normuon_beta2(self) -> float: ...


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """A 2-D weight inside a block (attention or MLP projection): Muon's share."""
    return p.dim() == 2 and name.startswith("blocks.")


def build(model: torch.nn.Module, cfg: OptimizerSettings) -> torch.optim.Optimizer:
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
    check_layout([(n, p) for n, p in named if is_hidden_matrix(n, p)], whole_rows=cfg.muon_normuon_beta2 > 0)
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
        orthogonaliser=ORTHOGONALISERS[cfg.muon_orthogonaliser],
        cautious_decay=cfg.muon_cautious_decay,
        normuon_beta2=cfg.muon_normuon_beta2,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's LR for this step, scaled per group (Muon's peak is its own)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
