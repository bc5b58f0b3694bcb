"""Export: plain safetensors + config, and a transformers model (Llama; Qwen3 with QK-norm) with
the same logits."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from lehr.__main__ import main
from lehr.engine.evals.evaluation import load_model
from lehr.engine.run.loop import train


def test_plain_and_hf_llama_exports(tiny_config, smoke_shards, tmp_path):
    summary = train(tiny_config(planned_steps=10))
    ckpt = tmp_path / "run" / "final"
    assert summary["final"] == str(ckpt)
    tok = str(smoke_shards / "tokenizer.json")
    assert main(["export", str(ckpt), str(tmp_path / "plain"), "--tokenizer", tok]) == 0
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert config["vocab_size"] == 512 and "lm_head.weight" not in load_file(
        tmp_path / "plain" / "model.safetensors"
    )

    assert main(["export", str(ckpt), str(tmp_path / "hf"), "--hf", "--tokenizer", tok]) == 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ours = load_model(ckpt, torch.device("cpu"))
    ids = torch.tensor([AutoTokenizer.from_pretrained(tmp_path / "hf")("The State of the Union").input_ids])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids)[0], rtol=1e-4, atol=1e-4)


def test_export_refuses_to_rewrite_a_checkpoint_or_ship_another_tokenizer(
    tiny_config, smoke_shards, tmp_path
):
    train(tiny_config(planned_steps=5))
    ckpt = tmp_path / "run" / "final"
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    for target in (ckpt, ckpt / "export", tmp_path / "run" / "checkpoints" / "latest_export" / ".."):
        assert main(["export", str(ckpt), str(target)]) == 2
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before
    other = tmp_path / "other-tokenizer.json"
    other.write_text((smoke_shards / "tokenizer.json").read_text().replace('"<|endoftext|>"', '"<|eot|>"'))
    assert main(["export", str(ckpt), str(tmp_path / "out"), "--tokenizer", str(other)]) == 2
    assert not (tmp_path / "out").exists()
    assert main(["export", str(ckpt), str(tmp_path / "out")]) == 0  # the shards' tokenizer, which matches
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (
        smoke_shards / "tokenizer.json"
    ).read_bytes()


@pytest.mark.parametrize(
    "shape, architecture",
    [({"n_kv_head": 1}, "LlamaForCausalLM"), ({"n_kv_head": 1, "qk_norm": True}, "Qwen3ForCausalLM")],
)
def test_grouped_query_and_qk_norm_models_export_to_the_same_logits(
    tiny_config, smoke_shards, tmp_path, shape, architecture
):
    from transformers import AutoModelForCausalLM

    from lehr.engine.model import preset

    train(tiny_config(planned_steps=5, model=preset("tiny", 512, **shape)))
    ckpt = tmp_path / "run" / "final"
    assert main(["export", str(ckpt), str(tmp_path / "hf"), "--hf"]) == 0
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == architecture and hf.config.num_key_value_heads == 1
    ids = torch.randint(0, 512, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(
            hf(ids).logits, load_model(ckpt, torch.device("cpu"))(ids)[0], rtol=1e-4, atol=1e-4
        )
