"""The step guard, kept on the device so that a step needs no host sync.

A step whose grad norm is not finite must leave the optimizer untouched, and so, when spike
skipping is on, must a step whose loss spikes: more than ``sigma`` standard deviations above the
mean of the last ``window`` steps' losses (OLMo-core's rule). Deciding either on the host would
stall the GPU queue every step, so the decision stays a tensor: the optimizer takes it as
``found_inf`` and skips the update inside its kernel (the mechanism ``GradScaler`` uses; see
``optim``), and the counts accumulate here until the host reads them where it syncs anyway (log,
eval and checkpoint steps).

Every finite loss enters the window, a skipped one too: a lasting change of level (the anneal's
data mix) widens the window's spread within a few steps instead of being skipped for good.
"""

from __future__ import annotations

from typing import Any

import torch


class StepGuard:
    def __init__(self, device: torch.device, spike_sigma: float = 0.0, spike_window: int = 64):
        zero = torch.zeros((), device=device)
        self.streak = zero.clone()  # non-finite steps in a row, up to the latest one
        self.longest = zero.clone()  # the longest streak since the host last read
        self.skipped = zero.clone()  # non-finite steps since the host last read
        self.spikes = zero.clone()  # loss spikes skipped since the host last read
        self.sigma = spike_sigma
        self.losses = torch.zeros(spike_window, device=device)  # a ring of the latest finite losses
        self.seen = torch.zeros((), dtype=torch.long, device=device)  # finite losses ever entered

    def observe(self, grad_norm: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        """Count this step; returns ``found_inf`` for the optimizer (1.0: skip this update).
        ``loss`` must be the same on every rank (the batch's), so every replica skips alike."""
        bad = ~torch.isfinite(grad_norm)
        self.streak = (self.streak + 1) * bad
        self.longest = torch.maximum(self.longest, self.streak)
        self.skipped += bad
        if self.sigma:
            bad = bad | self._spike(loss.float())
        return bad.float()

    def _spike(self, loss: torch.Tensor) -> torch.Tensor:
        window = self.losses.numel()
        mean, std = self.losses.mean(), self.losses.std()
        finite = torch.isfinite(loss)
        spike = (self.seen >= window) & finite & (loss > mean + self.sigma * std)
        self.spikes += spike
        at = (self.seen % window).view(1)
        self.losses.index_copy_(0, at, torch.where(finite, loss, self.losses[at]).view(1))
        self.seen += finite
        return spike

    def counts(self) -> list[torch.Tensor]:
        """[skipped, longest, spikes] as device scalars, read in the same transfer as the loss."""
        return [self.skipped, self.longest, self.spikes]

    def reset_window(self) -> None:
        """After the host has read ``counts``. A streak that is still going keeps counting in full."""
        self.skipped.zero_()
        self.longest.zero_()
        self.spikes.zero_()

    def state_dict(self) -> dict[str, Any]:
        """The loss window, oldest first (read at checkpoints, which sync anyway)."""
        window, seen = self.losses.numel(), int(self.seen)
        order = torch.arange(seen - min(seen, window), seen) % window
        return {"losses": self.losses.cpu()[order].tolist(), "seen": seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        window = self.losses.numel()
        losses, seen = state["losses"][-window:], state["seen"]
        for i, value in enumerate(losses):  # back in the ring where the saved run had them
            self.losses[(seen - len(losses) + i) % window] = value
        self.seen.fill_(seen)
