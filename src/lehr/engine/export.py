"""Export a checkpoint for use outside lehr: plain safetensors + config JSON, or a Hugging Face
``LlamaForCausalLM`` folder (the architecture is Llama's when ``qk_norm`` is off)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from lehr.engine.evaluation import load_model
from lehr.engine.model import ModelConfig, Transformer


def export_plain(checkpoint: Path, out: Path, tokenizer: Path | None = None) -> Path:
    """``model.safetensors`` (tied weights stored once) + ``config.json`` (+ ``tokenizer.json``)."""
    model = load_model(checkpoint, torch.device("cpu"))
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.cfg.tie_embeddings:
        state.pop("lm_head.weight")
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt", "lehr": "1"})
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(model.cfg), indent=1))
    if tokenizer is not None:
        shutil.copy2(tokenizer, out / "tokenizer.json")
    return out


def llama_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    names = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
    per_block = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
                 "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
                 "attn.v_proj": "self_attn.v_proj", "attn.o_proj": "self_attn.o_proj",
                 "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj", "mlp.down_proj": "mlp.down_proj"}
    out = {}
    for key, value in model.state_dict().items():
        if key.startswith("blocks."):
            _, i, rest = key.split(".", 2)
            module, param = rest.rsplit(".", 1)
            out[f"model.layers.{i}.{per_block[module]}.{param}"] = value
        else:
            out[names[key]] = value
    return out


def llama_config(cfg: ModelConfig):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.seq_len, rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings, hidden_act="silu", attention_bias=False, mlp_bias=False,
    )


def export_hf_llama(checkpoint: Path, out: Path, tokenizer: Path | None = None) -> Path:
    """A folder that ``transformers.AutoModelForCausalLM.from_pretrained`` loads."""
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    model = load_model(checkpoint, torch.device("cpu"))
    if model.cfg.qk_norm:
        raise ValueError("a model with qk_norm has no Llama equivalent; export it with the plain format")
    hf = LlamaForCausalLM(llama_config(model.cfg))
    missing, unexpected = hf.load_state_dict(llama_state_dict(model), strict=False)
    unexpected = [k for k in unexpected if not k.endswith("rotary_emb.inv_freq")]
    missing = [k for k in missing if not (model.cfg.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"Llama mapping incomplete: missing {missing}, unexpected {unexpected}")
    hf.save_pretrained(out)
    if tokenizer is not None:
        PreTrainedTokenizerFast(tokenizer_file=str(tokenizer), eos_token="<|endoftext|>").save_pretrained(out)
    return out
