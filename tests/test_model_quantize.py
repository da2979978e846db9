"""`swapcheck model quantize --from LOCAL_HF_DIR --out DIR` (issue #37): a local float checkpoint, saved by
transformers, turned into the compressed-tensors W8A8 INT8 checkpoint vLLM 0.32 loads. On the CPU engine
the written checkpoint's logits equal those of swapcheck's own in-memory quantization of the same float
weights, bit for bit, under both INT8 kernel orders; Qwen3 and Llama families; bad input is exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tasks.models import build_model
from tasks.models.checkpoint import read_checkpoint, tiny_qwen3_float

runner = CliRunner()
PROMPTS = [[1, 5, 9, 3], [2, 7, 7, 7, 4, 1]]


def _llama_float(seed: int = 0):  # noqa: ANN202 - transformers' model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08)
    return model


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_the_written_checkpoint_computes_bit_for_bit_what_the_float_one_quantized_in_memory_does(
        tmp_path: Path, family: str) -> None:
    src, out = tmp_path / f"{family}-float", tmp_path / f"{family}-w8a8"
    hf = tiny_qwen3_float(seed=3) if family == "qwen3" else _llama_float(seed=3)
    hf.save_pretrained(src, safe_serialization=True)  # a float checkpoint as transformers writes it
    res = runner.invoke(app, ["model", "quantize", "--from", str(src), "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    manifest = json.loads(res.output)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    assert cfg["architectures"] == ["Qwen3ForCausalLM" if family == "qwen3" else "LlamaForCausalLM"]
    assert set(manifest["source"]["files"]) >= {"config.json", "model.safetensors"}
    ck = read_checkpoint(out)  # checks model.safetensors against the MANIFEST
    assert ck.quantized and ck.tensors["model.layers.0.mlp.down_proj.weight"].dtype == torch.int8
    for kernel in ("int8-cutlass-order", "int8-triton-order"):
        in_memory, written = build_model(str(src), kernel=kernel), build_model(str(out), kernel=kernel)
        assert torch.equal(in_memory.forward_tokens(PROMPTS), written.forward_tokens(PROMPTS)), kernel


def test_bad_input_is_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "float"
    tiny_qwen3_float(seed=0).save_pretrained(src, safe_serialization=True)
    out = tmp_path / "out"
    res = runner.invoke(app, ["model", "quantize", "--from", str(tmp_path / "nowhere"), "--out", str(out)])
    assert res.exit_code == 2 and "not a local checkpoint directory" in res.output and not out.exists()
    assert runner.invoke(app, ["model", "quantize", "--from", str(src), "--out", str(out)]).exit_code == 0
    again = runner.invoke(app, ["model", "quantize", "--from", str(out), "--out", str(tmp_path / "twice")])
    assert again.exit_code == 2 and "already quantized" in again.output and not (tmp_path / "twice").exists()
    busy = runner.invoke(app, ["model", "quantize", "--from", str(src), "--out", str(out)])
    assert busy.exit_code == 2 and "not an empty directory" in busy.output
