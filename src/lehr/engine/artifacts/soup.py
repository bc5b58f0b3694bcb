"""Model soup: the uniform average of the weights of several anneal branches of one model."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from lehr.engine.artifacts import checkpoint
from lehr.engine.artifacts.state import State
from lehr.engine.model import ModelConfig, Transformer


def average(finals: list[Path], out: Path) -> Path:
    """Write a checkpoint at ``out`` whose weights average those of ``finals`` (same model config)."""
    if len(finals) < 2:
        raise ValueError("a soup needs at least two branches")
    states = [State.read(p) for p in finals]
    configs = {json.dumps(s.config["model"], sort_keys=True) for s in states}
    if len(configs) > 1:
        raise ValueError(f"cannot average branches of different model configs: {', '.join(map(str, finals))}")
    for p in finals:
        checkpoint.verify(p)
    model = Transformer(ModelConfig(**states[0].config["model"]))
    weights = [load_file(p / "model.safetensors") for p in finals]
    soup = {
        k: torch.stack([w[k].float() for w in weights]).mean(0).to(weights[0][k].dtype) for k in weights[0]
    }
    missing, _ = model.load_state_dict(soup, strict=False)
    assert set(missing) <= {"lm_head.weight"}, missing  # only the tied head, stored once
    state = {
        **states[0].record,
        "soup_of": [str(p) for p in finals],
        "progress": {**states[0].progress, "evals": [], "best_loss": None},
    }
    return checkpoint.write(out, model=model, optimizer_state={}, state=state, rng_per_rank=[])
