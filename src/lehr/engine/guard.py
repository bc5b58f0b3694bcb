"""The non-finite guard, kept on the device so that a step needs no host sync.

A step whose grad norm is not finite must leave the optimizer untouched. Deciding that on the host
would stall the GPU queue every step, so the decision stays a tensor: fused AdamW takes it as
``found_inf`` and skips the update inside its kernel (the mechanism ``GradScaler`` uses), and the
counts of skipped steps accumulate here until the host reads them where it syncs anyway (log, eval
and checkpoint steps).
"""

from __future__ import annotations

import torch


class NonFiniteGuard:
    def __init__(self, device: torch.device):
        self.streak = torch.zeros((), device=device)  # skipped steps in a row, up to the latest one
        self.longest = torch.zeros((), device=device)  # the longest streak since the host last read
        self.skipped = torch.zeros((), device=device)  # skipped steps since the host last read

    def observe(self, grad_norm: torch.Tensor) -> torch.Tensor:
        """Count this step; returns ``found_inf`` for the optimizer (1.0: skip this update)."""
        bad = (~torch.isfinite(grad_norm)).float()
        self.streak = (self.streak + 1) * bad
        self.longest = torch.maximum(self.longest, self.streak)
        self.skipped += bad
        return bad

    def counts(self) -> list[torch.Tensor]:
        """[skipped, longest] as device scalars, for the host to read in the same transfer as the loss."""
        return [self.skipped, self.longest]

    def reset_window(self) -> None:
        """After the host has read ``counts``. A streak that is still going keeps counting in full."""
        self.skipped.zero_()
        self.longest.zero_()
