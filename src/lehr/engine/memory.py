"""What a run will need per GPU, estimated before any work: parameters, gradients, optimizer state
and activations for the chosen parallelism, and a refusal, naming what to change, when it cannot
fit.

The figures are estimates in the usual accounting (fp32 master weights, gradients, AdamW's two
moments or Muon's one and its Newton-Schulz work; activations of a pre-norm block as Korthikanti
et al. count them, with an SDPA kernel that stores no attention matrix), not measurements:
allocator slack, CUDA context and compiled kernels' workspaces come on top, hence the headroom.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lehr.engine.model import VE_GATE_CHANNELS, ModelConfig

GIB = 2**30
HEADROOM = 0.9  # of the device's memory the estimate may use


@dataclass(frozen=True)
class Estimate:
    parameters: float  # bytes per GPU
    gradients: float
    optimizer: float  # the state it keeps
    optimizer_work: float  # what its step holds for a moment (Muon's gathered matrices)
    activations: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.optimizer_work + self.activations

    def describe(self, per: str = "GPU") -> str:
        """``per``: what holds this much (a GPU, or a process in RAM on a CPU run)."""
        parts = ("parameters", "gradients", "optimizer", "optimizer_work", "activations")
        unit, size = ("GiB", GIB) if self.total >= GIB / 10 else ("MiB", 2**20)
        return (
            f"{self.total / size:.1f} {unit} per {per} ("
            + ", ".join(f"{p.replace('_', ' ')} {getattr(self, p) / size:.2f}" for p in parts)
            + ")"
        )


def hidden_matrix_count(cfg: ModelConfig) -> int:
    """Parameters in the attention and MLP projections, and the value embeddings' gates (Muon's
    share with ``optimizer: muon``)."""
    kv = cfg.kv_heads * cfg.head_dim
    mlp = (2 if cfg.mlp == "relu2" else 3) * cfg.d_model * cfg.d_ff
    gates = value_embed_layers(cfg) * VE_GATE_CHANNELS * cfg.kv_heads
    return cfg.n_layer * (2 * cfg.d_model * cfg.d_model + 2 * cfg.d_model * kv + mlp) + gates


def value_embed_layers(cfg: ModelConfig) -> int:
    return sum(cfg.has_value_embed(i) for i in range(cfg.n_layer))


def embedding_count(cfg: ModelConfig) -> int:
    """The token embedding and the value embeddings: tables looked up, held by the root module."""
    return cfg.vocab_size * (cfg.d_model + value_embed_layers(cfg) * cfg.kv_heads * cfg.head_dim)


def parameter_count(cfg: ModelConfig) -> int:
    gains = 2 * cfg.d_model + (2 * cfg.head_dim if cfg.qk_norm else 0)
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model
    scalars = 2 * cfg.n_layer if cfg.layer_scalars else 0
    return (
        hidden_matrix_count(cfg) + cfg.n_layer * gains + embedding_count(cfg) + head + cfg.d_model + scalars
    )


@dataclass(frozen=True)
class Setup:
    """What besides the model decides the memory per GPU."""

    micro_batch: int
    world: int  # processes (GPUs) in all
    parallel: str  # ddp | fsdp
    precision: str  # the resolved one: bf16, fp16, fp8 or fp32
    activation_checkpointing: str  # none | blocks
    optimizer: str  # adamw (two fp32 moments per parameter) | muon (one on the hidden matrices)
    muon_work: str = "shared"  # shared | redundant (see optim.MUON_WORK)


def estimate(cfg: ModelConfig, setup: Setup) -> Estimate:
    n = parameter_count(cfg)
    fsdp = setup.parallel == "fsdp"
    shards = setup.world if fsdp else 1
    act_bytes = 2 if setup.precision in ("bf16", "fp16", "fp8") else 4
    block_params = (n - embedding_count(cfg)) / cfg.n_layer
    # FSDP gathers a block (and prefetches the next) in the compute dtype, and its gradient.
    gathered = 2 * block_params * act_bytes * 2 if fsdp else 0
    # The value embeddings live in the root unit, gathered (with their gradients) for the whole step.
    ve_tables = embedding_count(cfg) - cfg.vocab_size * cfg.d_model
    gathered += ve_tables * act_bytes * 2 if fsdp else 0
    s, b, h = cfg.seq_len, setup.micro_batch, cfg.d_model
    kv = cfg.kv_heads * cfg.head_dim
    # Stored for the backward, per block: norm inputs and outputs, q/k/v, attention output, the
    # residuals, and the MLP's gate, up and product (ReLU squared: its input and output).
    per_block = s * b * (6 * h + 2 * kv + (2 if cfg.mlp == "relu2" else 3) * cfg.d_ff) * act_bytes
    if setup.activation_checkpointing == "blocks":  # each block's input, plus one block recomputed
        blocks = cfg.n_layer * s * b * h * act_bytes + per_block
    else:
        blocks = cfg.n_layer * per_block
    # The ingredients' own: each value embedding looked up (fp32) and gated; the layer scalars'
    # inputs, kept for their gradients (each block's, and the embedding once).
    blocks += value_embed_layers(cfg) * s * b * kv * (4 + act_bytes)
    blocks += (cfg.n_layer + 1) * s * b * h * 4 if cfg.layer_scalars else 0
    # Logits, their fp32 copy, its gradient; a soft-cap keeps its tanh and the capped copy too.
    logits = s * b * cfg.vocab_size * (act_bytes + 4 + 4 + (8 if cfg.logit_softcap else 0))
    return Estimate(
        parameters=4 * n / shards + gathered / 2,
        gradients=4 * n / shards + gathered / 2,
        optimizer=(8 * n - (4 * hidden_matrix_count(cfg) if setup.optimizer == "muon" else 0)) / shards,
        optimizer_work=muon_work(cfg, setup) if setup.optimizer == "muon" else 0.0,
        activations=blocks + logits,
    )


def muon_work(cfg: ModelConfig, setup: Setup) -> float:
    """Bytes Muon's step holds on one GPU beyond its state: the momentum-updated gradients (fp32)
    of this rank's matrices, the matrices it orthogonalises in bf16 with Newton-Schulz's working
    copies of them (four bf16 copies in all), and what the exchange sends and receives in bf16
    (``optim``): under FSDP this
    rank's shards out and its owned matrices in; under DDP shared, every result gathered."""
    hidden = hidden_matrix_count(cfg)
    fsdp, world = setup.parallel == "fsdp", setup.world
    held = hidden / world if fsdp else hidden
    owned = hidden if setup.muon_work == "redundant" or world == 1 else hidden / world
    exchange = 0.0
    if world > 1 and fsdp:
        exchange = 2 * (held + owned)
    elif world > 1 and setup.muon_work == "shared":
        exchange = 2 * hidden
    return 4 * held + 2 * 4 * owned + exchange


def check_fits(cfg: ModelConfig, setup: Setup, device_bytes: int | None) -> Estimate:
    """The estimate; raises before any work when it exceeds the device, naming what would fit.
    On the CPU (``device_bytes`` None) the estimate is only reported."""
    est = estimate(cfg, setup)
    if device_bytes is None or est.total <= HEADROOM * device_bytes:
        return est
    smaller = max(1, setup.micro_batch // 4)
    fsdp = dict(parallel="fsdp")
    changes: dict[str, dict[str, Any]] = {
        "pretrain.parallel: fsdp": fsdp,
        "pretrain.activation_checkpointing: blocks": dict(activation_checkpointing="blocks"),
        "both": dict(fsdp, activation_checkpointing="blocks"),
        f"pretrain.micro_batch: {smaller}": dict(micro_batch=smaller),
    }
    options = []
    for label, change in changes.items():
        other = dataclasses.replace(setup, **change)
        if other == setup:
            continue  # already so
        need = estimate(cfg, other).total
        verdict = "fits" if need <= HEADROOM * device_bytes else "still too much"
        options.append(f"{label}: {need / GIB:.1f} GiB ({verdict})")
    raise MemoryError(
        f"this run would need about {est.describe()}, more than {HEADROOM:.0%} of the "
        f"{device_bytes / GIB:.0f} GiB free on the GPU. Options: "
        + "; ".join(options)
        + "; or more GPUs (fsdp divides "
        "parameters, gradients and optimizer state by their number), or a smaller model."
    )
