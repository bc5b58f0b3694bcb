"""Two finished runs compared: their final weights and every train loss both logged."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def weights(run_dir: Path) -> dict:
    return load_file(run_dir / "final" / "model.safetensors")


def losses(run_dir: Path) -> dict[int, float]:
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


def assert_same(
    a: Path, b: Path, *, exact: bool, rtol: float = 0.0, atol: float = 0.0, loss_atol: float = 0.0
):
    """Bit for bit, or within the tolerances (weights: rtol, atol; logged losses: loss_atol).
    An interrupted run also logs the step it stopped at; every step ``a`` logged must match."""
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        if exact:
            assert torch.equal(wa[k], wb[k]), k
        else:
            torch.testing.assert_close(wa[k], wb[k], rtol=rtol, atol=atol)
    la, lb = losses(a), losses(b)
    assert set(la) <= set(lb)
    for step, x in la.items():
        assert x == lb[step] if exact else abs(x - lb[step]) < loss_atol, (step, la, lb)
