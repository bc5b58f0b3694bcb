"""Decoder-only transformer: RoPE, RMSNorm, causal SDPA attention, SwiGLU, optional QK-norm.

The layout follows Llama (rotate-half RoPE, pre-norm blocks, bias-free linears) so that weights
map one-to-one onto a Hugging Face ``LlamaForCausalLM`` when ``qk_norm`` is off.

The small-model ingredients the peers measured are settings, each off by default; off, the model
is the one above, parameter for parameter and bit for bit (``ModelConfig.ingredients``):

* ``mlp: relu2``: a two-matrix MLP with ReLU squared (modded-nanogpt record #5; nanochat).
* ``logit_softcap``: logits squashed to (-cap, cap) by cap * tanh(logits / cap) (Gemma 2;
  modded-nanogpt record #18; nanochat uses 15).
* ``layer_scalars``: before each block, x = r_i * x + k_i * x0, with x0 the token embedding and
  r_i, k_i learned (nanochat's resid_lambdas and x0_lambdas). Unlike nanochat's (tuned starts
  around 1.1 and 0.2, the embedding normed, a learning rate of their own) they start at 1 and 0,
  where the model is the one without them, and learn at ``lr`` with the other gains.
* ``value_embeds``: on every other block (the last always), a second embedding of the tokens added
  to the attention's values through a learned per-head gate in (0, 3) (modded-nanogpt record #14,
  in nanochat's gated form).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import skip_init
from torch.utils.checkpoint import checkpoint

from lehr.config_parts import not_in_use, setting

Mlp = Literal["swiglu", "relu2"]
MLPS: tuple[Mlp, ...] = typing.get_args(Mlp)
INGREDIENTS = ("mlp", "logit_softcap", "layer_scalars", "value_embeds")
VE_GATE_CHANNELS = 12  # channels of a block's input the value embedding's gate reads (nanochat's)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int  # tokens; must equal the tokenizer's vocabulary size
    seq_len: int  # context length in tokens
    n_layer: int  # transformer blocks
    n_head: int  # attention heads; d_model must be a multiple
    d_model: int  # residual stream width
    d_ff: int  # MLP hidden width (SwiGLU's per gate)
    rope_theta: float = 10000.0  # RoPE base frequency
    qk_norm: bool = False  # RMSNorm on queries and keys (stabilises high LRs; not in Llama)
    tie_embeddings: bool = True  # output projection shares the token embedding
    norm_eps: float = 1e-5
    init_std: float = 0.02  # std of the normal init of every matrix
    # Key/value heads (grouped-query attention: each serves n_head / n_kv_head query heads);
    # None = n_head, plain multi-head attention.
    n_kv_head: int | None = setting(None, off=None)
    # The ingredients (the module's docstring has each one's source).
    mlp: Mlp = setting("swiglu", off="swiglu")  # swiglu | relu2 (d_ff is its hidden width)
    logit_softcap: float | None = setting(None, off=None)  # e.g. 15; None = logits as they are
    layer_scalars: bool = setting(False, off=False)  # learned residual and x0 scales before each block
    value_embeds: bool = setting(False, off=False)  # gated value embeddings on alternate blocks

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(
                f"model.d_model = {self.d_model} is not a multiple of model.n_head = {self.n_head}"
            )
        if (self.d_model // self.n_head) % 2:
            raise ValueError("model head size (d_model / n_head) must be even for RoPE")
        if self.n_kv_head is not None and (self.n_kv_head < 1 or self.n_head % self.n_kv_head):
            raise ValueError(
                f"model.n_kv_head = {self.n_kv_head} must divide model.n_head = {self.n_head} "
                f"(each key/value head serves the same number of query heads)"
            )
        if self.mlp not in MLPS:
            raise ValueError(f"model.mlp = {self.mlp!r} must be one of {', '.join(MLPS)}")
        cap = self.logit_softcap
        if cap is not None and not (_is_number(cap) and 0 < cap < math.inf):
            raise ValueError(f"model.logit_softcap = {cap!r} must be a positive number (15 is usual) or null")
        if cap is not None:  # 15 and 15.0 are one setting: one math hash, one run folder
            object.__setattr__(self, "logit_softcap", float(cap))
        for flag in ("layer_scalars", "value_embeds"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"model.{flag} = {getattr(self, flag)!r} must be true or false")
        if self.value_embeds and self.d_model < VE_GATE_CHANNELS:
            raise ValueError(
                f"model.value_embeds needs model.d_model >= {VE_GATE_CHANNELS} (the gate reads that many "
                f"channels); d_model is {self.d_model}: widen the model or set value_embeds: false"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def ingredients(self) -> list[str]:
        """The ingredients in use, as ``field=value`` (empty: the plain Llama layout)."""
        return [f"{name}={getattr(self, name)}" for name in INGREDIENTS if name not in not_in_use(self)]

    def has_value_embed(self, layer: int) -> bool:
        """Every other block has one, counted back from the last (which always has it): nanochat's rule."""
        return self.value_embeds and layer % 2 == (self.n_layer - 1) % 2

    def math_dict(self) -> dict[str, Any]:
        """The fields that shape the model's math, as checkpoints record them. A field added after
        checkpoints existed is left out at its "not in use" value, so those checkpoints still resume."""
        absent = not_in_use(self)
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in absent}


_M = TypeVar("_M", bound=nn.Module)
_F = TypeVar("_F", bound=Callable[..., Any])


def _drawn_later(cls: type[_M], *args: Any, **kwargs: Any) -> _M:
    """An ingredient's module, built without drawing a number (``_init_weights`` draws them), on
    the device modules are built on (the meta device, for a size count)."""
    module: _M = skip_init(cls, *args, device=torch.get_default_device(), **kwargs)
    return module


def _eager(fn: _F) -> _F:
    """``torch.compiler.disable`` (untyped) with ``fn``'s type: ``fn`` runs eagerly, outside the graph."""
    disabled: _F = torch.compiler.disable(fn)
    return disabled


def _of_an_ingredient(module_name: str) -> bool:
    return module_name.startswith("value_embeds.") or module_name.endswith("ve_gate")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# vocab_size and seq_len of a preset are defaults; the run sets vocab_size from the tokenizer.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(seq_len=64, n_layer=2, n_head=2, d_model=64, d_ff=176),
    # The CPU recipe (docs/recipe.md): three wide blocks rather than four of 192 (as good, faster
    # on a CPU), a 256-token context, QK-norm (exports as transformers' Qwen3).
    "cpu-demo": dict(seq_len=256, n_layer=3, n_head=4, d_model=256, d_ff=688, qk_norm=True),
    "gpt2-small": dict(seq_len=1024, n_layer=12, n_head=12, d_model=768, d_ff=2048),
    # Llama-style GPU presets with grouped-query attention (~350M and ~1.2B with a 32k vocabulary).
    "llama-350m": dict(seq_len=2048, n_layer=24, n_head=16, n_kv_head=4, d_model=1024, d_ff=3072),
    "llama-1b": dict(seq_len=2048, n_layer=16, n_head=32, n_kv_head=8, d_model=2048, d_ff=8192),
}


def preset(name: str, vocab_size: int, **overrides: Any) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    fields = [f.name for f in dataclasses.fields(ModelConfig) if f.name != "vocab_size"]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        close = [m for name in unknown for m in difflib.get_close_matches(name, fields, n=1, cutoff=0.75)]
        guess = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(
            f"unknown model field(s) {', '.join(unknown)}{guess}; the fields are: {', '.join(fields)}"
        )
    return ModelConfig(vocab_size=vocab_size, **{**PRESETS[name], **overrides})


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Normalised in fp32 whatever the dtypes (autocast gives QK-norm bf16 projections, FSDP's
        # mixed precision bf16 gains): the bits torch's unfused path gives mixed dtypes, no warning.
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


def rope_tables(cfg: ModelConfig) -> tuple[Tensor, Tensor]:
    inv_freq = 1.0 / (
        cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    )
    angles = torch.outer(torch.arange(cfg.seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, value_embed: bool = False):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.ve_gate = (
            _drawn_later(nn.Linear, VE_GATE_CHANNELS, cfg.kv_heads, bias=False) if value_embed else None
        )

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, ve: Tensor | None = None, mask: Tensor | None = None
    ) -> Tensor:
        b, t, d = x.shape
        q = self.q_proj(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k, v = (
            p(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2) for p in (self.k_proj, self.v_proj)
        )
        if ve is not None:  # per key/value head, a gate in (0, 3) on the token's value embedding
            assert self.ve_gate is not None  # a block is handed value embeddings only if it has the gate
            gate = 3 * torch.sigmoid(self.ve_gate(x[..., :VE_GATE_CHANNELS]))
            v = v + (gate.unsqueeze(-1) * ve.view(b, t, self.n_kv_head, self.head_dim)).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:  # both or neither (qk_norm)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # SDPA picks flash / memory-efficient kernels on GPU and a fused CPU kernel otherwise.
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=self.n_kv_head != self.n_head
        )
        out: Tensor = self.o_proj(y.transpose(1, 2).reshape(b, t, d))
        return out


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class ReLU2(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down_proj(F.relu(self.up_proj(x)).square())
        return out


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, value_embed=cfg.has_value_embed(layer))
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = ReLU2(cfg) if cfg.mlp == "relu2" else SwiGLU(cfg)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, ve: Tensor | None = None, mask: Tensor | None = None
    ) -> Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, ve, mask)
        out: Tensor = x + self.mlp(self.mlp_norm(x))
        return out


class Transformer(nn.Module):
    rope_cos: Tensor  # buffers (register_buffer), not saved: rebuilt from the config
    rope_sin: Tensor

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.checkpoint_blocks = False  # activation checkpointing: set by the engine, not the math
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        kv_dim = cfg.kv_heads * cfg.head_dim
        layers = [i for i in range(cfg.n_layer) if cfg.has_value_embed(i)]
        self.value_embeds = nn.ModuleDict(
            {str(i): _drawn_later(nn.Embedding, cfg.vocab_size, kv_dim) for i in layers}
        )
        self.resid_scales = nn.Parameter(torch.ones(cfg.n_layer)) if cfg.layer_scalars else None
        self.x0_scales = nn.Parameter(torch.zeros(cfg.n_layer)) if cfg.layer_scalars else None
        self._init_weights()

    def _init_weights(self) -> None:
        """Every matrix and table normal(0, init_std), the residual projections scaled by depth
        (GPT-2: keeps the residual stream's variance flat); the ingredients' own parameters last,
        so that the plain model's parameters draw the same numbers with them on as off (an
        ablation then compares like with like)."""
        cfg = self.cfg
        modules = list(self.named_modules())
        for name, m in modules:
            if isinstance(m, (nn.Linear, nn.Embedding)) and not _of_an_ingredient(name):
                nn.init.normal_(m.weight, std=cfg.init_std)
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=cfg.init_std / math.sqrt(2 * cfg.n_layer))
        for name, m in modules:
            if name.startswith("value_embeds."):
                nn.init.normal_(m.weight, std=cfg.init_std)
            elif name.endswith("ve_gate"):  # gates start a little above neutral (nanochat)
                nn.init.uniform_(m.weight, 0.0, 0.02)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        logits = self.logits(self.hidden(idx))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def hidden(self, idx: Tensor, positions: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """The normed last hidden state at every position: what the head reads. Evals call it and
        then ``logits`` at the positions they score only (the head is a third of cpu-demo's work).

        By default a row is one causal sequence. An eval may pack several into a row instead, with
        each token's ``positions`` (batch, T), each below ``seq_len``, and a boolean ``mask``
        (batch, 1, T, T) of what it attends to: the choices of a question after their one context.
        """
        t = idx.shape[1]
        if positions is None:
            if t > self.cfg.seq_len:
                raise ValueError(f"input of {t} tokens exceeds model.seq_len = {self.cfg.seq_len}")
            cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        else:
            cos, sin = self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)
        x0, value_embeds = self._lookups(idx)
        x = x0
        for i, block in enumerate(self.blocks):
            if self.resid_scales is not None and self.x0_scales is not None:  # both or neither
                x = self.resid_scales[i] * x + self.x0_scales[i] * x0
            ve = value_embeds.get(i)
            if self.checkpoint_blocks and torch.is_grad_enabled():  # keep only the block's input
                x = checkpoint(block, x, cos, sin, ve, mask, use_reentrant=False)
            else:
                x = block(x, cos, sin, ve, mask)
        out: Tensor = self.norm(x)
        return out

    @_eager
    def _lookups(self, idx: Tensor) -> tuple[Tensor, dict[int, Tensor]]:
        """The token embeddings and each layer's value embeddings, always run eagerly: inductor's CPU
        code for a lookup's backward adds each token's gradient into its row with atomics from every
        thread, so the sums' order, and a run's bits, change from one run to the next; eager's
        backward adds them in one order. Outside the compiled graph, a compiled run repeats itself
        (a fresh clone's ``dvc repro`` gives the committed lock) at the cost of one graph break."""
        return self.embed(idx), {int(layer): table(idx) for layer, table in self.value_embeds.items()}

    def logits(self, hidden: Tensor) -> Tensor:
        logits: Tensor = self.lm_head(hidden)
        if self.cfg.logit_softcap is not None:  # in fp32: tanh saturates early in bf16
            cap = self.cfg.logit_softcap
            logits = cap * torch.tanh(logits.float() / cap)
        return logits

    def num_parameters(self, non_embedding: bool = False) -> int:
        """Every parameter; ``non_embedding``: those a token's forward multiplies (not the lookups)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.embed.weight.numel() + sum(p.numel() for p in self.value_embeds.parameters())
        return n

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 per weight (forward + backward matmuls) plus attention.

        Attention scores and values cost 2 * 2 * seq_len * d_model per layer forward; times 3 for
        forward + backward gives the 12 * L * T * d term (full, not causal-halved, as in PaLM's MFU).
        """
        cfg = self.cfg
        matmul_weights = self.num_parameters(non_embedding=True)
        if cfg.tie_embeddings:  # the tied output projection is a matmul even though it is "embedding"
            matmul_weights += self.lm_head.weight.numel()
        return 6 * matmul_weights + 12 * cfg.n_layer * cfg.seq_len * cfg.d_model

    @torch.no_grad()
    def generate(
        self: LanguageModel,  # an ``ExportedHF`` borrows it
        idx: Tensor,
        max_new_tokens: int,
        temperature: float,
        top_k: int,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.cfg.seq_len :])
            logits = logits[:, -1, :].float() / temperature
            kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
            logits[logits < kth] = -float("inf")
            probs = torch.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


class LanguageModel(Protocol):
    """What the evals score and sample: a checkpoint's ``Transformer``, or a transformers model
    behind the same interface (``artifacts.export.ExportedHF``, an ``--hf`` export)."""

    @property
    def cfg(self) -> Any: ...  # its seq_len and vocab_size

    @property
    def training(self) -> bool: ...

    def __call__(self, idx: Tensor) -> tuple[Tensor, Tensor | None]: ...

    def hidden(self, idx: Tensor, positions: Tensor | None = None, mask: Tensor | None = None) -> Tensor: ...

    def logits(self, hidden: Tensor) -> Tensor: ...

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...

    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float,
        top_k: int,
        generator: torch.Generator | None = None,
    ) -> Tensor: ...
