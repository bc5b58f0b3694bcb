"""FP8 training of the transformer blocks' linear layers, through torchao's float8 training.

torchao is PyTorch's own maintained implementation: each converted layer casts its input, weight
and output gradient to FP8 with dynamic per-tensor scales (e4m3 forward, e5m2 gradients) around
``torch._scaled_mm``, so there is no scale history to checkpoint and resume stays exact. Weights
remain fp32 parameters under the same names: checkpoints, export and evaluation see a plain model.
The output projection stays in bf16, where FP8's rounding costs the most quality for its share of
the FLOPs.
"""

from __future__ import annotations

from torch import nn


def convert(model: nn.Module) -> int:
    """Swaps eligible ``nn.Linear`` layers for torchao's ``Float8Linear`` in place; returns how many."""
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError as e:
        raise ValueError(
            "precision fp8 needs torchao: pip install -e '.[fp8]' (or `pip install torchao`), "
            "or choose precision bf16"
        ) from e

    def eligible(module: nn.Module, name: str) -> bool:
        # _scaled_mm needs both dimensions to be multiples of 16.
        return (
            isinstance(module, nn.Linear)
            and name != "lm_head"
            and module.in_features % 16 == 0
            and module.out_features % 16 == 0
        )

    before = sum(isinstance(m, nn.Linear) for m in model.modules())
    convert_to_float8_training(model, module_filter_fn=eligible)
    return before - sum(type(m) is nn.Linear for m in model.modules())
