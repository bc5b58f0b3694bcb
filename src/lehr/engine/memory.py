"""What a run will need per GPU, estimated before any work: parameters, gradients, optimizer state
and activations for the chosen parallelism, and a refusal, naming what to change, when it cannot
fit.

The figures are estimates in the usual accounting (fp32 master weights, gradients and AdamW's two
moments; activations of a pre-norm block as Korthikanti et al. count them, with an SDPA kernel
that stores no attention matrix), not measurements: allocator slack, CUDA context and compiled
kernels' workspaces come on top, hence the headroom.
"""

from __future__ import annotations

from dataclasses import dataclass

from lehr.engine.model import ModelConfig

GIB = 2**30
HEADROOM = 0.9  # of the device's memory the estimate may use


@dataclass(frozen=True)
class Estimate:
    parameters: float  # bytes per GPU
    gradients: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations

    def describe(self) -> str:
        parts = ("parameters", "gradients", "optimizer", "activations")
        return (
            f"{self.total / GIB:.1f} GiB per GPU ("
            + ", ".join(f"{p} {getattr(self, p) / GIB:.2f}" for p in parts)
            + ")"
        )


def parameter_count(cfg: ModelConfig) -> int:
    kv = cfg.kv_heads * cfg.head_dim
    block = (
        2 * cfg.d_model * cfg.d_model + 2 * cfg.d_model * kv + 3 * cfg.d_model * cfg.d_ff + 2 * cfg.d_model
    )
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model
    return cfg.n_layer * block + cfg.vocab_size * cfg.d_model + head + cfg.d_model


def estimate(
    cfg: ModelConfig,
    micro_batch: int,
    world: int,
    parallel: str,
    precision: str,
    activation_checkpointing: str,
) -> Estimate:
    n = parameter_count(cfg)
    shards = world if parallel == "fsdp" else 1
    low = precision in ("bf16", "fp16", "fp8")
    act_bytes = 2 if low else 4
    block_params = (n - cfg.vocab_size * cfg.d_model) / cfg.n_layer
    # FSDP gathers a block (and prefetches the next) in the compute dtype, and its gradient.
    gathered = 2 * block_params * act_bytes * 2 if parallel == "fsdp" else 0
    s, b, h = cfg.seq_len, micro_batch, cfg.d_model
    kv = cfg.kv_heads * cfg.head_dim
    # Stored for the backward, per block: norm inputs and outputs, q/k/v, attention output, the
    # residuals, and the MLP's gate, up and product (each s*b wide).
    per_block = s * b * (6 * h + 2 * kv + 3 * cfg.d_ff) * act_bytes
    if activation_checkpointing == "blocks":  # only each block's input, plus one block recomputed
        blocks = cfg.n_layer * s * b * h * act_bytes + per_block
    else:
        blocks = cfg.n_layer * per_block
    logits = s * b * cfg.vocab_size * (act_bytes + 4 + 4)  # logits, their fp32 copy, its gradient
    return Estimate(
        parameters=4 * n / shards + gathered / 2,
        gradients=4 * n / shards + gathered / 2,
        optimizer=8 * n / shards,
        activations=blocks + logits,
    )


def check_fits(
    cfg: ModelConfig,
    micro_batch: int,
    world: int,
    parallel: str,
    precision: str,
    activation_checkpointing: str,
    device_bytes: int | None,
) -> Estimate:
    """The estimate; raises before any work when it exceeds the device, naming what would fit.
    On the CPU (``device_bytes`` None) the estimate is only reported."""
    est = estimate(cfg, micro_batch, world, parallel, precision, activation_checkpointing)
    if device_bytes is None or est.total <= HEADROOM * device_bytes:
        return est
    now = dict(
        micro_batch=micro_batch,
        world=world,
        parallel=parallel,
        precision=precision,
        activation_checkpointing=activation_checkpointing,
    )
    changes = {
        "pretrain.parallel: fsdp": dict(parallel="fsdp"),
        "pretrain.activation_checkpointing: blocks": dict(activation_checkpointing="blocks"),
        "both": dict(parallel="fsdp", activation_checkpointing="blocks"),
        f"pretrain.micro_batch: {max(1, micro_batch // 4)}": dict(micro_batch=max(1, micro_batch // 4)),
    }
    options = []
    for label, change in changes.items():
        if all(now[k] == v for k, v in change.items()):
            continue  # already so
        other = estimate(cfg, **(now | change))
        fits = "fits" if other.total <= HEADROOM * device_bytes else "still too much"
        options.append(f"{label}: {other.total / GIB:.1f} GiB ({fits})")
    raise MemoryError(
        f"this run would need about {est.describe()}, more than {HEADROOM:.0%} of the GPU's "
        f"{device_bytes / GIB:.0f} GiB. Options: " + "; ".join(options) + "; or more GPUs (fsdp divides "
        "parameters, gradients and optimizer state by their number), or a smaller model."
    )
