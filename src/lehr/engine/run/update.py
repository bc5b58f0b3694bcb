"""The update of one optimizer step, all on the device: accumulate the micro-batches' gradients (autocast
forward, scaled loss plus the optional z-loss, backward; no gradient sync but on the last),
unscale and clip, then the optimizer step, which skips itself when the guard says so (a
non-finite grad norm, a loss spike). Nothing here reads a tensor on the host; the loop does that
at its sync points."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from lehr.engine.hardware import Hardware, memory_report
from lehr.engine.processes import parallel
from lehr.engine.run.guard import StepGuard


@dataclass
class StepResult:
    loss: torch.Tensor  # the mean loss of this rank's share of the batch, on the device
    grad_norm: torch.Tensor  # before clipping, on the device
    lr: float


def accumulate(
    forward: Callable[..., Any],  # the model's call, compiled or not
    model: torch.nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    scaler: torch.amp.GradScaler,
    hw: Hardware,
    z_loss: float = 0.0,
) -> torch.Tensor:
    """Backward over the micro-batches; returns the batch's mean cross-entropy (the z-loss is
    trained on, not reported) as a device scalar."""
    step_loss = torch.zeros((), device=hw.device)
    rows = [len(x) for x, _ in batches]
    for i, (x, y) in enumerate(batches):
        with parallel.no_sync(model, last=i == len(batches) - 1):
            with hw.compute():
                logits, loss = forward(x, y)
            objective = loss + z_loss * logits.float().logsumexp(-1).square().mean() if z_loss else loss
            scaler.scale(_share(objective, len(x), rows)).backward()
        step_loss += _share(loss.detach(), len(x), rows)
    return step_loss


def _share(t: torch.Tensor, n: int, rows: list[int]) -> torch.Tensor:
    """A micro-batch's part of the step's mean over its sequences, so that the accumulated gradient
    is that of the whole batch: ``t`` / their count where the micro-batches are equal (the bits of
    every run before the batch-size warmup), ``t`` x n / the rows where a warmup stage ends on a
    smaller one."""
    if len(set(rows)) == 1:
        return t / len(rows)
    return t * (n / sum(rows))


def apply(
    core: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    guard: StepGuard,
    grad_clip: float,
    loss: torch.Tensor,
) -> torch.Tensor:
    """Unscale, clip, step (skipped on the device when the guard says so); returns the grad norm.
    ``loss`` is the batch's mean loss, the same on every rank."""
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(core.parameters(), grad_clip or float("inf"))
    if isinstance(grad_norm, DTensor):  # FSDP: the norm over every rank's shards, on every rank
        grad_norm = grad_norm.full_tensor()
    found_inf = guard.observe(grad_norm, loss)
    # bf16 and fp32: the guard's verdict skips the step on the device (under fp16 the scaler
    # hands the optimizer its own found_inf instead)
    if not scaler.is_enabled():
        # an attribute torch's fused optimizers (and MuonAdamW) read but do not declare
        vars(optimizer)["found_inf"] = found_inf
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def out_of_memory(step: int, hw: Hardware, micro_batch: int) -> RuntimeError:
    return RuntimeError(
        f"out of GPU memory at step {step} ({memory_report(hw.device)}). Lower micro_batch "
        f"(now {micro_batch}; accumulation keeps batch_size), model.seq_len, or the model size."
    )
