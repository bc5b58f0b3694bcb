"""How the model is spread over the processes: DDP (a whole replica each) or FSDP2 (parameters,
gradients and optimizer state sharded by ``fully_shard``), with activation checkpointing of the
blocks; and the state-dict helpers that let a checkpoint move between the two and across
process counts.

State dicts go through ``torch.distributed.checkpoint.state_dict`` for both kinds: the optimizer
state is keyed by parameter name, not by position, so a checkpoint written under one kind (or
one process count) loads under the other.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    OptimizerStateType,
    StateDictOptions,
    ValueType,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from lehr.engine.hardware import Hardware
from lehr.engine.model import Transformer

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
SHARDED = StateDictOptions(full_state_dict=False)


def shard(model: Transformer, hw: Hardware) -> None:
    """FSDP2 in place: each block its own unit (gathered just before it runs, freed after), the
    root holding the embeddings, final norm and head. On GPUs the blocks compute in bf16 and
    reduce gradients in fp32; on CPU everything stays fp32."""
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if hw.device.type == "cuda" and hw.precision == "bf16"
        else MixedPrecisionPolicy()
    )
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)


def replicate(model: Transformer, hw: Hardware, world: int) -> torch.nn.Module:
    """The module the steps run: DDP over several processes, the model itself on one."""
    if world == 1:
        return model
    return DDP(model, device_ids=[hw.device.index] if hw.device.type == "cuda" else None)


def no_sync(module: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager[None]:
    """Gradients of all but the last micro-batch stay local: DDP skips its all-reduce, FSDP2 its
    reduce-scatter (it keeps the unsharded gradients until the last)."""
    if isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(last)
        return contextlib.nullcontext()
    if isinstance(module, DDP) and not last:
        return module.no_sync()
    return contextlib.nullcontext()


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def full_model_state(model: torch.nn.Module) -> dict[str, ValueType]:
    """Every parameter whole, on the CPU (gathered from the shards under FSDP: every rank takes part)."""
    return get_model_state_dict(model, options=FULL)


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> OptimizerStateType:
    return get_optimizer_state_dict(model, optimizer, options=FULL)


def load_full_model_state(model: torch.nn.Module, state: dict[str, ValueType]) -> None:
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))


def load_full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """A whole optimizer state keyed by parameter name; one saved by position (checkpoints before
    2026-12-01, DDP only) loads as it was saved."""
    if keyed_by_position(state):
        optimizer.load_state_dict(state)
    else:
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
    _as_built(optimizer)


def keyed_by_position(state: dict[str, Any]) -> bool:
    """An optimizer state saved by parameter position (DDP checkpoints before 2026-12-01)."""
    return bool(state.get("state")) and all(isinstance(k, int) for k in state["state"])


def _as_built(optimizer: torch.optim.Optimizer) -> None:
    """Hyperparameters in the types the optimizer was built with: loading a state dict hands tuples
    (AdamW's betas) back as lists, and the next save would then write other bytes for the same state."""
    for group in optimizer.param_groups:
        for key, value in group.items():
            if key != "params" and isinstance(value, list):
                group[key] = tuple(value)


def sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """This rank's shards of the model (and optimizer), for DCP."""
    state: dict[str, Any] = {"model": get_model_state_dict(model, options=SHARDED)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer, options=SHARDED)
    return state


def load_sharded_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: dict[str, Any]
) -> None:
    set_model_state_dict(model, state["model"], options=SHARDED)
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=SHARDED)
        _as_built(optimizer)
