"""The memory estimate per GPU and the refusal of a run that cannot fit; grouped-query attention."""

from __future__ import annotations

import pytest
import torch

from lehr.engine.memory import GIB, Setup, check_fits, estimate, hidden_matrix_count, parameter_count
from lehr.engine.model import ModelConfig, Transformer, preset


@pytest.mark.parametrize("name", ["tiny", "cpu-demo", "gpt2-small", "llama-350m"])
def test_the_estimate_counts_the_parameters_a_model_has(name):
    cfg = preset(name, 4096)
    with torch.device("meta"):  # shapes only: no memory for the big presets
        model = Transformer(cfg)
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters())


def test_fsdp_divides_the_states_and_checkpointing_the_activations():
    cfg = preset("llama-1b", 32000)
    ddp = estimate(cfg, Setup(8, 8, "ddp", "bf16", "none", "adamw"))
    fsdp = estimate(cfg, Setup(8, 8, "fsdp", "bf16", "none", "adamw"))
    assert fsdp.optimizer == pytest.approx(ddp.optimizer / 8)
    assert fsdp.activations == ddp.activations
    ac = estimate(cfg, Setup(8, 8, "fsdp", "bf16", "blocks", "adamw"))
    assert ac.activations < ddp.activations / 2 and ac.optimizer == fsdp.optimizer
    assert (
        0.95e9 < parameter_count(cfg) < 1.3e9
        and 0.25e9 < parameter_count(preset("llama-350m", 32000)) < 0.4e9
    )


def test_a_run_that_cannot_fit_is_refused_naming_what_would():
    cfg = preset("llama-1b", 32000)
    with pytest.raises(MemoryError) as e:
        check_fits(cfg, Setup(16, 8, "ddp", "bf16", "none", "adamw"), 24 * GIB)
    message = str(e.value)
    assert "more than 90% of the 24 GiB free on the GPU" in message
    assert "pretrain.parallel: fsdp" in message and "pretrain.activation_checkpointing: blocks" in message
    assert "both: " in message and "(fits)" in message
    assert check_fits(cfg, Setup(16, 8, "fsdp", "bf16", "blocks", "adamw"), 24 * GIB).total < 0.9 * 24 * GIB
    assert check_fits(cfg, Setup(16, 1, "ddp", "bf16", "none", "adamw"), None).total > 0  # CPU: reported only


def test_grouped_query_attention_shares_key_value_heads():
    cfg = ModelConfig(vocab_size=64, seq_len=16, n_layer=1, n_head=4, n_kv_head=2, d_model=32, d_ff=64)
    model = Transformer(cfg)
    assert model.blocks[0].attn.k_proj.weight.shape == (16, 32)
    logits, _ = model(torch.randint(0, 64, (2, 16)))
    assert logits.shape == (2, 16, 64)
    with pytest.raises(ValueError, match="n_kv_head = 3 must divide model.n_head = 4"):
        ModelConfig(vocab_size=64, seq_len=16, n_layer=1, n_head=4, n_kv_head=3, d_model=32, d_ff=64)


def test_an_unknown_parallel_kind_or_fsdp_with_fp8_is_refused(tiny_config):
    from lehr.config_parts import ConfigError

    with pytest.raises(ConfigError, match="parallel = 'zero3'.*ddp.*fsdp"):
        tiny_config(parallel="zero3")
    with pytest.raises(ConfigError, match="precision = 'fp8' is not supported with parallel: fsdp"):
        tiny_config(parallel="fsdp", precision="fp8")


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_optimizer_state_estimate_is_what_the_optimizer_keeps(tiny_config, optimizer):
    from lehr.engine import optim

    cfg = tiny_config(optimizer=optimizer, model=preset("tiny", 512, qk_norm=True))
    model = Transformer(cfg.model)
    opt = optim.build(model, cfg)
    model(torch.randint(0, 512, (2, 16)))[0].sum().backward()
    opt.step()
    kept = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if t.dim() > 0)
    assert kept == estimate(cfg.model, Setup(4, 1, "ddp", "fp32", "none", optimizer)).optimizer


def test_a_muon_run_is_offered_fsdp_and_its_work_is_counted(tiny_config):
    """Muon runs under FSDP, so a Muon run that cannot fit is offered FSDP as it is, a config
    TrainConfig accepts; Muon's working memory shrinks with the ranks that share it."""
    cfg = preset("llama-1b", 32000)
    with pytest.raises(MemoryError) as e:
        check_fits(cfg, Setup(16, 8, "ddp", "bf16", "none", "muon"), 24 * GIB)
    message = str(e.value)
    assert "pretrain.parallel: fsdp:" in message and "adamw" not in message
    tiny_config(parallel="fsdp", optimizer="muon")  # accepted
    work = {
        kind: estimate(cfg, Setup(8, 8, parallel, "bf16", "none", "muon", muon)).optimizer_work
        for kind, parallel, muon in (
            ("fsdp", "fsdp", "shared"),
            ("ddp shared", "ddp", "shared"),
            ("ddp redundant", "ddp", "redundant"),
        )
    }
    assert work["fsdp"] < work["ddp shared"] < work["ddp redundant"]
    assert estimate(cfg, Setup(8, 8, "fsdp", "bf16", "none", "adamw")).optimizer_work == 0
    hidden = hidden_matrix_count(cfg)
    assert work["ddp redundant"] == 12 * hidden  # fp32 momentum-updated gradients + 4 bf16 copies
