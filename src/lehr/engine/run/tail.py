"""Tail averaging of an anneal (``tail_steps``): the weights after each of the decay's last steps,
averaged uniformly into the run's final model (the uniform form of the Tail-EMA in the peers'
records; Polyak averaging restricted to where the learning rate is already small).

The running sum lives in the optimizer's state, one ``tail_sum`` beside each parameter's moments,
so that a checkpoint saves it and a resume restores it by the optimizer's own machinery, whole
under DDP and as shards under FSDP (where each rank sums its shards). How many steps it holds
follows from the step, so nothing else is saved. At the decay's end (or an early stop within the
tail) the average takes the weights' place and the sums leave the state: a branch from the final
model starts a tail of its own. A run stopped before its decay's end (``end_step``, a signal)
keeps its sums, and its resume goes on adding to them.
"""

from __future__ import annotations

import torch

from lehr.engine.optim.muon_work import local_shard

KEY = "tail_sum"


def first_step(decay_end: int, tail_steps: int) -> int:
    """The first step (counted after it is taken) whose weights enter the average."""
    return decay_end - tail_steps + 1


def add(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The weights as they are now, added to each parameter's running sum."""
    with torch.no_grad():
        for p in model.parameters():
            state = optimizer.state[p]
            if KEY not in state:
                state[KEY] = torch.zeros_like(p, dtype=torch.float32)
            local_shard(state[KEY]).add_(local_shard(p))


def drop(optimizer: torch.optim.Optimizer) -> None:
    """Sums of another run's tail (an origin saved inside it), out of the state."""
    for state in optimizer.state.values():
        state.pop(KEY, None)


def average_into_weights(model: torch.nn.Module, optimizer: torch.optim.Optimizer, count: int) -> bool:
    """Each weight replaced by its tail's mean over ``count`` steps, and the sums dropped; False
    when there is no tail to average (none begun, or averaged already)."""
    params = [p for p in model.parameters() if KEY in optimizer.state[p]]
    if not params or count < 1:
        return False
    with torch.no_grad():
        for p in params:
            local_shard(p).copy_(local_shard(optimizer.state[p].pop(KEY)) / count)
    return True
