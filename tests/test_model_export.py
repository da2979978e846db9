"""``swapcheck model export`` (docs/models.md "Answer models on vLLM"): a shipped model written as a
compressed-tensors W8A8 directory round-trips bit for bit through ``read_checkpoint`` / ``build_model``,
its manifest records the source and every file's sha256, a damaged export is refused, and a vLLM arm
whose ``model`` is a shipped name runs the cached export (checked on every use)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tasks.models import build_model
from tasks.models.checkpoint import (
    ManifestError,
    check_manifest,
    read_checkpoint,
    shipped_model_dir,
)
from tasks.models.export import EXPORT_FORMAT, check_export, exported_model_dir

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import train_answer_model as tam  # noqa: E402

runner = CliRunner()
PAIRS = [(1, 2), (999, 999), (123, 989), (500, 500), (7, 93), (640, 361)]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_export_round_trips_bit_for_bit_with_its_manifest(tmp_path: Path) -> None:
    out = tmp_path / "answer-qwen3-w8a8"
    res = runner.invoke(app, ["model", "export", "answer-qwen3", "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert shown == {"out": str(out), **manifest}
    source = check_manifest(shipped_model_dir("answer-qwen3"))
    assert source is not None
    assert manifest["format"] == EXPORT_FORMAT and manifest["source"]["model"] == "answer-qwen3"
    assert manifest["source"]["model_safetensors_sha256"] == source["model_safetensors_sha256"]
    assert manifest["files"] == {f: _sha(out / f) for f in ("config.json", "model.safetensors")}
    assert manifest["model_safetensors_sha256"] == manifest["files"]["model.safetensors"]
    assert check_export(out, "answer-qwen3") == manifest

    # vLLM picks the model class from architectures: null made it serve Qwen3Model as a pooling model
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    ckpt = read_checkpoint(out)
    assert ckpt.quantized and ckpt.quantization_config is not None
    assert ckpt.quantization_config["quant_method"] == "compressed-tensors"
    assert ckpt.tensors["model.layers.0.self_attn.q_proj.weight"].dtype == torch.int8
    prompts = [tam.encode_prompt(a, b) for a, b in PAIRS]
    for kernel in ("int8-cutlass-order", "int8-triton-order"):
        shipped, exported = build_model("answer-qwen3", kernel=kernel), build_model(str(out), kernel=kernel)
        for name, lin in shipped.linears().items():
            got = exported.linears()[name]
            assert torch.equal(lin.weight, got.weight) and torch.equal(lin.weight_scale, got.weight_scale), name
        assert torch.equal(shipped.forward_tokens(prompts), exported.forward_tokens(prompts))  # bit-identical
        gen = exported.generate(prompts, tam.ANSWER_LEN)
        assert [tam.decode_answer(t) for t in gen.tokens] == [a + b for a, b in PAIRS]

    # the export is deterministic: a second one writes the same bytes
    again = tmp_path / "again"
    export2 = runner.invoke(app, ["model", "export", "answer-qwen3", "--out", str(again), "--format", "json"])
    assert export2.exit_code == 0, export2.output
    assert json.loads(export2.output)["files"] == manifest["files"]

    # a damaged export is refused on load
    data = bytearray((again / "model.safetensors").read_bytes())
    data[-1] ^= 0x01
    (again / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="does not match MANIFEST.json"):
        read_checkpoint(again)


def test_export_refuses_bad_input_with_exit_2(tmp_path: Path) -> None:
    res = runner.invoke(app, ["model", "export", "tiny-qwen4", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "not a shipped model; allowed: answer-qwen3" in res.output
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    res = runner.invoke(app, ["model", "export", "answer-qwen3", "--out", str(busy)])
    assert res.exit_code == 2 and "exists and is not an empty directory" in res.output
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]
    listed = runner.invoke(app, ["model", "list", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    (row,) = [r for r in json.loads(listed.output) if r["name"] == "answer-qwen3"]
    assert row["sha256"] == _sha(shipped_model_dir("answer-qwen3") / "model.safetensors")


def test_a_vllm_arm_on_a_shipped_name_runs_the_checked_cached_export(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tasks.models.vllm_engine as ve
    from tasks.models.arms import build_vllm_engine, vllm_model

    monkeypatch.setenv("SWAPCHECK_MODEL_CACHE", str(tmp_path / "cache"))
    first = exported_model_dir("answer-qwen3")
    sha = check_manifest(shipped_model_dir("answer-qwen3"))["model_safetensors_sha256"]  # type: ignore[index]
    assert first == tmp_path / "cache" / f"answer-qwen3@{sha[:16]}-w8a8-r2"
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert vllm_model("answer-qwen3") == str(first) and (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert vllm_model("/models/Qwen3-8B-W8A8") == "/models/Qwen3-8B-W8A8"  # a path is passed as it is
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [first.name]  # no staging left behind

    # What the vLLM engine is given (the engine itself needs a GPU: tests/test_model_export_gpu below).
    seen: dict[str, Any] = {}

    class Recorder:
        def __init__(self, model: str, **kwargs: Any) -> None:
            seen.update(model=model, **kwargs)

    monkeypatch.setattr(ve, "VllmEngine", Recorder)
    arm = {"name": "cutlass", "kernel": "cutlass", "params": {}, "scales": "real", "engine": "vllm", "env": {}}
    build_vllm_engine({"model": "answer-qwen3", "model_seed": 0, "prompts": {"tokens": [[1, 2, 3]]},
                       "max_new_tokens": 5, "arm": arm})
    assert seen["model"] == str(first) and seen["max_model_len"] == 3 + 5 + 1

    # a damaged cached export is refused, naming the directory to remove
    (first / "config.json").write_text((first / "config.json").read_text() + " ")
    with pytest.raises(ManifestError, match="remove .* to export again"):
        vllm_model("answer-qwen3")


@pytest.mark.gpu
def test_vllm_runs_the_exported_answer_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU node with vLLM: an arm on ``answer-qwen3`` generates through vLLM from the cached export
    and answers the additions the CPU engine answers."""
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from tasks.models.arms import build_vllm_engine

    monkeypatch.setenv("SWAPCHECK_MODEL_CACHE", str(tmp_path / "cache"))
    prompts = [tam.encode_prompt(a, b) for a, b in PAIRS]
    arm = {"name": "cutlass", "kernel": "cutlass", "params": {}, "scales": "real", "engine": "vllm", "env": {}}
    engine = build_vllm_engine({"model": "answer-qwen3", "model_seed": 0, "prompts": {"tokens": prompts},
                                "max_new_tokens": tam.ANSWER_LEN, "arm": arm})
    gen = engine.generate(prompts, tam.ANSWER_LEN, top_k=3)
    assert [tam.decode_answer(list(t)) for t in gen.tokens] == [a + b for a, b in PAIRS]
