"""Export a checkpoint for use outside lehr: plain safetensors + config JSON, or a Hugging Face
folder that ``AutoModelForCausalLM`` loads: ``LlamaForCausalLM`` when ``qk_norm`` is off, else
``Qwen3ForCausalLM`` (Llama's layout plus an RMSNorm on each head's queries and keys before RoPE,
which is lehr's QK-norm); and load either back for scoring and sampling."""

from __future__ import annotations

import dataclasses
import json
import shutil
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from lehr.config_parts import not_in_use
from lehr.engine.artifacts.checkpoint import load_weights, verify, written_or_nothing
from lehr.engine.artifacts.state import STATE, State, is_checkpoint
from lehr.engine.evals.evaluation import load_model
from lehr.engine.model import INGREDIENTS, LanguageModel, ModelConfig, Transformer
from lehr.files.atomic import as_umask_allows, sha256_file, staged_dir
from lehr.tokens import ENDOFTEXT

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, PreTrainedModel, Qwen3Config


class ExportError(ValueError):
    """An export that would damage a checkpoint or ship a mismatched tokenizer."""


def check_target(checkpoint: Path, out: Path) -> None:
    """Refuse to write into a checkpoint or a folder that holds one (an export there would rewrite it)."""
    out, checkpoint = out.resolve(), checkpoint.resolve()
    for folder in (out, *out.parents):
        if folder == checkpoint or is_checkpoint(folder):
            raise ExportError(
                f"refusing to export into {out}: it is inside the checkpoint {folder}, which the "
                f"export would rewrite. Choose a folder outside any checkpoint."
            )
    # An export replaces its folder whole: only a new folder or an earlier export may be replaced.
    if (
        out.is_dir()
        and any(out.iterdir())
        and (not (out / "config.json").is_file() or next(out.rglob(STATE), None))
    ):
        raise ExportError(
            f"refusing to export into {out}: it exists and is not an earlier export, and the export "
            f"would replace everything in it. Choose a new folder."
        )


def checked_tokenizer(checkpoint: Path, tokenizer: Path | None) -> Path:
    """The tokenizer the checkpoint was trained with: ``tokenizer`` if given, else the one beside the
    shards it trained on; refused unless its sha256 is the one the checkpoint recorded."""
    state = State.read(checkpoint)
    want = state.tokenizer_sha256
    path = tokenizer or Path(state.config["shards"]) / "tokenizer.json"
    if not path.is_file():
        raise ExportError(
            f"tokenizer {path} is missing: pass --tokenizer with the tokenizer this checkpoint "
            f"was trained with (sha256 {want[:12]}…)"
        )
    got = sha256_file(path)
    if got != want:
        raise ExportError(
            f"tokenizer {path} (sha256 {got[:12]}…) is not the one {checkpoint} was trained with "
            f"(sha256 {want[:12]}…): the data was re-tokenized since. Restore that tokenizer "
            f"(git checkout <commit> && dvc checkout) or pass --tokenizer with it."
        )
    return path


def _written_whole(out: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(folder)`` into a staging folder and swap it in whole."""
    with written_or_nothing(out), staged_dir(out) as staging:  # a full disk: said, the earlier export kept
        write(staging)
    return out


def export_plain(checkpoint: Path, out: Path, tokenizer: Path | None = None) -> Path:
    """``model.safetensors`` (tied weights stored once) + ``config.json`` + ``tokenizer.json``."""
    return _export(checkpoint, out, tokenizer, _write_plain)


def _export(
    checkpoint: Path, out: Path, tokenizer: Path | None, write: Callable[[Path, Path, Path], None]
) -> Path:
    """Every input verified before anything is written, then ``out`` written whole or not at all."""
    verify(checkpoint)
    check_target(checkpoint, out)
    tokenizer = checked_tokenizer(checkpoint, tokenizer)
    return _written_whole(out, lambda folder: write(checkpoint, folder, tokenizer))


def _write_plain(checkpoint: Path, out: Path, tokenizer: Path) -> None:
    model = load_model(checkpoint, torch.device("cpu"))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.cfg.tie_embeddings:
        state.pop("lm_head.weight")
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt", "lehr": "1"})
    as_umask_allows(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(plain_config(model.cfg), indent=1))
    shutil.copy2(tokenizer, out / "tokenizer.json")


def plain_config(cfg: ModelConfig) -> dict[str, Any]:
    """The config an export folder holds: every field, less the ingredients not in use (so that a
    plain model's export is the same file as before they existed)."""
    unused = set(INGREDIENTS) & not_in_use(cfg)
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in unused}


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    names = {
        "embed.weight": "model.embed_tokens.weight",
        "norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight",
    }
    per_block = {
        "attn_norm": "input_layernorm",
        "mlp_norm": "post_attention_layernorm",
        "attn.q_proj": "self_attn.q_proj",
        "attn.k_proj": "self_attn.k_proj",
        "attn.v_proj": "self_attn.v_proj",
        "attn.o_proj": "self_attn.o_proj",
        "attn.q_norm": "self_attn.q_norm",
        "attn.k_norm": "self_attn.k_norm",
        "mlp.gate_proj": "mlp.gate_proj",
        "mlp.up_proj": "mlp.up_proj",
        "mlp.down_proj": "mlp.down_proj",
    }
    out = {}
    for key, value in model.state_dict().items():
        if key.startswith("blocks."):
            _, i, rest = key.split(".", 2)
            module, param = rest.rsplit(".", 1)
            out[f"model.layers.{i}.{per_block[module]}.{param}"] = value
        else:
            out[names[key]] = value
    return out


def hf_config(cfg: ModelConfig) -> LlamaConfig | Qwen3Config:
    """The transformers config of the same architecture: Llama's, or Qwen3's when QK-norm is on."""
    if cfg.ingredients:
        raise ExportError(
            f"this model uses {', '.join(cfg.ingredients)}, which neither LlamaForCausalLM nor "
            f"Qwen3ForCausalLM has: export it without --hf (safetensors and its config), "
            f"which lehr's generate and eval load"
        )
    from transformers import LlamaConfig, Qwen3Config

    shape: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings,
        hidden_act="silu",
        attention_bias=False,
    )
    if cfg.qk_norm:
        return Qwen3Config(**shape, use_sliding_window=False)
    return LlamaConfig(**shape, mlp_bias=False)


def export_hf(checkpoint: Path, out: Path, tokenizer: Path | None = None) -> Path:
    """A folder that ``transformers.AutoModelForCausalLM.from_pretrained`` loads."""
    return _export(checkpoint, out, tokenizer, _write_hf)


def _write_hf(checkpoint: Path, out: Path, tokenizer: Path) -> None:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    model = load_model(checkpoint, torch.device("cpu"))
    hf = AutoModelForCausalLM.from_config(hf_config(model.cfg))
    missing, unexpected = hf.load_state_dict(hf_state_dict(model), strict=False)
    unexpected = [k for k in unexpected if not k.endswith("rotary_emb.inv_freq")]
    missing = [k for k in missing if not (model.cfg.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(
            f"{type(hf).__name__} mapping incomplete: missing {missing}, unexpected {unexpected}"
        )
    hf.save_pretrained(out)
    PreTrainedTokenizerFast(tokenizer_file=str(tokenizer), eos_token=ENDOFTEXT).save_pretrained(out)


class ExportedHF(torch.nn.Module):
    """A transformers causal LM (an ``--hf`` export) behind lehr's model interface (``model(ids)
    -> (logits, None)``, ``hidden``, ``logits``, ``cfg.seq_len`` and ``cfg.vocab_size``), so the task
    scorer and ``generate`` take it as they take a checkpoint."""

    generate = Transformer.generate  # the same sampling, over this module's forward

    def __init__(self, hf: PreTrainedModel) -> None:
        super().__init__()
        self.hf = hf
        self.cfg = types.SimpleNamespace(
            seq_len=hf.config.max_position_embeddings, vocab_size=hf.config.vocab_size
        )

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.hf(input_ids=ids).logits, None

    def hidden(
        self, ids: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """As ``Transformer.hidden``. transformers takes a 4-D mask as is, and eager attention adds
        it to the scores: so it goes as 0 where a token may attend and the dtype's minimum where not."""
        if mask is not None:
            dtype = self.hf.get_output_embeddings().weight.dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(dtype).min
            )
        last: torch.Tensor = self.hf.get_decoder()(
            input_ids=ids, position_ids=positions, attention_mask=mask
        ).last_hidden_state
        return last

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.hf.get_output_embeddings()(hidden)
        return logits


def load_export(folder: Path, device: torch.device) -> LanguageModel:
    """The model of an export folder, plain (lehr's config.json) or ``--hf`` (a transformers one)."""
    config = json.loads((folder / "config.json").read_text())
    if "model_type" in config:
        from transformers import AutoModelForCausalLM

        return ExportedHF(AutoModelForCausalLM.from_pretrained(folder)).to(device).eval()
    model = Transformer(ModelConfig(**config))
    load_weights(folder, model)
    return model.to(device).eval()


def load_for_inference(
    folder: Path, tokenizer: Path | None, device: torch.device
) -> tuple[LanguageModel, Tokenizer]:
    """The model and tokenizer of a checkpoint or of an export folder (plain or ``--hf``); a
    checkpoint's tokenizer must be the one it recorded."""
    from tokenizers import Tokenizer

    model: LanguageModel
    if is_checkpoint(folder):
        model, tokenizer = load_model(folder, device), checked_tokenizer(folder, tokenizer)
    elif (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        model, tokenizer = load_export(folder, device), tokenizer or folder / "tokenizer.json"
    else:
        raise FileNotFoundError(
            f"{folder} is neither a checkpoint (state.json) nor an export (config.json + "
            f"model.safetensors): pass a folder such as data/06_models/pre_anneal or one made by "
            f"`python -m lehr export`"
        )
    return model, Tokenizer.from_file(str(tokenizer))
