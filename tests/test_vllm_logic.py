"""The GPU path's logic, without a GPU or vLLM: kernel forcing per vLLM version, selection-log
parsing, per-layer evidence, call counting, logprob rows, the evidence check, fused-layer
splitting, and the GPU kernels' availability reasons and fallback rule."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from torch import nn

from tasks.kernels import KernelError, get_kernel, list_kernels
from tasks.kernels import cuda as kcuda
from tasks.kernels.operands import check_operands
from tasks.models.capture import CapturedLayer
from tasks.models.predictions import predict
from tasks.models.vllm_engine import (
    CallCounter,
    ForcingError,
    KernelEvidenceError,
    VllmEngine,
    VllmEngineError,
    assemble_logits,
    check_evidence,
    forcing,
    generation_from_outputs,
    kernel_classes,
    layer_gemm_shapes,
    layer_kernels,
    merge_env,
    parse_selection_log,
    predicted_fallbacks,
    require_evidence,
    runtime_reason,
    score_from_logits,
    score_from_prompt_logprobs,
    split_fused,
    vllm_layer_name,
    vllm_op_targets,
)
from tests.conftest import REPO

GPU_KERNELS = ("vllm-cutlass", "vllm-cutlass-raw", "vllm-triton", "torch-scaled-mm-cuda")
SUPPORTED = ("0.29.0", "0.30.1", "0.31.0", "0.32.0")

# -- forcing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", SUPPORTED)
def test_forcing_int8_on_supported_versions(version):
    tri = forcing("triton", version)
    assert tri["family"] == "triton-int8"
    assert tri["env"] == {"VLLM_DISABLED_KERNELS": "CutlassInt8ScaledMMLinearKernel"}
    assert tri["expected_classes"] == ["TritonInt8ScaledMMLinearKernel"]
    assert tri["expected_op"] == "triton" and tri["log_verb"] == "Selected" and tri["llm_kwargs"] == {}
    cut = forcing("cutlass-int8", version)
    assert cut["env"] == {
        "VLLM_DISABLED_KERNELS": "TritonInt8ScaledMMLinearKernel,HummingInt8ScaledMMLinearKernel"
    }
    assert cut["expected_classes"] == ["CutlassInt8ScaledMMLinearKernel"] and cut["expected_op"] == "cutlass"
    for f in (tri, cut):
        assert " " not in f["env"]["VLLM_DISABLED_KERNELS"]  # vLLM strips nothing (§1.2)


@pytest.mark.parametrize("version", SUPPORTED)
def test_forcing_fp8(version):
    t = forcing("torch", version)
    assert t["family"] == "torch-fp8" and t["expected_op"] == "torch"
    disabled = t["env"]["VLLM_DISABLED_KERNELS"].split(",")
    assert "CutlassFP8ScaledMMLinearKernel" in disabled and "FlashInferFP8ScaledMMLinearKernel" in disabled
    assert set(t["expected_classes"]) >= {"PerTensorTorchFP8ScaledMMLinearKernel", "ChannelWiseTorchFP8ScaledMMLinearKernel"}
    c = forcing("cutlass-fp8", version)
    assert c["expected_classes"] == ["CutlassFP8ScaledMMLinearKernel"]
    assert "CutlassFP8ScaledMMLinearKernel" not in c["env"]["VLLM_DISABLED_KERNELS"]


def test_forcing_old_versions_use_old_names_and_log_verb():
    f = forcing("triton", "0.14.0")
    assert f["env"] == {"VLLM_DISABLED_KERNELS": "CutlassScaledMMLinearKernel"}
    assert f["expected_classes"] == ["TritonScaledMMLinearKernel"] and f["log_verb"] == "Using"
    assert forcing("cutlass", "0.13.0")["env"] == {"VLLM_DISABLED_KERNELS": "TritonScaledMMLinearKernel"}
    assert forcing("cutlass", "0.11.0")["env"] == {"VLLM_DISABLED_KERNELS": ""}  # the only candidate
    assert forcing("triton", "0.16.0")["expected_classes"] == ["TritonInt8ScaledMMLinearKernel"]
    assert kernel_classes("0.14.0")["cutlass-int8"] == "CutlassScaledMMLinearKernel"
    assert kernel_classes("0.17.0")["cutlass-int8"] == "CutlassInt8ScaledMMLinearKernel"
    assert "cutlass-fp8" not in kernel_classes("0.20.0")


def test_forcing_linear_backend():
    f = forcing("triton", "0.32.0", mechanism="linear_backend")
    assert f["llm_kwargs"] == {"linear_backend": "triton"} and f["env"] == {}
    b = forcing("torch", "0.31.0", mechanism="both")
    assert b["llm_kwargs"] == {"linear_backend": "torch"} and "VLLM_DISABLED_KERNELS" in b["env"]
    assert forcing("cutlass", "0.25.0", mechanism="linear_backend")["llm_kwargs"] == {"linear_backend": "cutlass"}


@pytest.mark.parametrize(
    "args,match",
    [
        (("triton", "0.12.0"), "not a CUDA candidate before 0.13"),
        (("cutlass", "0.15.2"), "0.15 was not checked"),
        (("torch", "0.20.0"), "FP8 kernel forcing is supported from 0.29"),
        (("triton", "0.20.0", "linear_backend"), "linear_backend exists from 0.25"),
        (("triton", "0.32.0", "magic"), "unknown forcing mechanism"),
        (("marlin", "0.32.0"), "unknown kernel family 'marlin'; allowed: cutlass-int8"),
        (("triton", "0.34.0"), "up to 0.33"),
        (("triton", "0.10.0"), "no facts before 0.11"),
        (("triton", "latest"), "cannot read the vLLM version"),
    ],
)
def test_forcing_refuses_with_reason(args, match):
    with pytest.raises(ForcingError, match=match):
        forcing(*args)


def test_merge_env_unites_disabled_lists_and_refuses_a_clash():
    f = forcing("triton", "0.32.0")
    env = merge_env(f, {"VLLM_DISABLED_KERNELS": "HummingInt8ScaledMMLinearKernel", "OTHER": "1"})
    assert env == {
        "VLLM_DISABLED_KERNELS": "CutlassInt8ScaledMMLinearKernel,HummingInt8ScaledMMLinearKernel",
        "OTHER": "1",
    }
    with pytest.raises(ForcingError, match="disables TritonInt8ScaledMMLinearKernel"):
        merge_env(f, {"VLLM_DISABLED_KERNELS": "TritonInt8ScaledMMLinearKernel"})


# -- selection log -----------------------------------------------------------------------------------

LOG_032 = """\
INFO 11-30 06:45:01 [model_runner.py:123] Starting to load model /models/qwen3-8b-w8a8...
INFO 11-30 06:45:02 [__init__.py:847] Selected TritonInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8
INFO 11-30 06:45:02 [cuda.py:311] Using Flash Attention backend.
INFO 11-30 06:45:03 [__init__.py:847] Selected TritonInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8
"""


def test_parse_selection_log_new_format_dedupes():
    assert parse_selection_log(LOG_032) == [("TritonInt8ScaledMMLinearKernel", "CompressedTensorsW8A8Int8")]


def test_parse_selection_log_old_format_fp8_and_colours():
    text = (
        "\x1b[32mINFO\x1b[0m 02-05 09:08:46 compressed_tensors_w8a8_int8.py:51] "
        "Using CutlassScaledMMLinearKernel for CompressedTensorsW8A8Int8\n"
        "INFO Selected CutlassFP8ScaledMMLinearKernel for Fp8LinearMethod\n"
        "INFO Using max model len 4096 for this model\n"  # not a kernel
        "INFO Applied linear backend override for 'int8_w8a8': 'triton'\n"
    )
    assert parse_selection_log(text) == [
        ("CutlassScaledMMLinearKernel", "CompressedTensorsW8A8Int8"),
        ("CutlassFP8ScaledMMLinearKernel", "Fp8LinearMethod"),
    ]
    assert parse_selection_log("") == []


# -- fake vLLM module trees ---------------------------------------------------------------------------

Cutlass = type("CutlassInt8ScaledMMLinearKernel", (), {"apply_weights": lambda self, layer, x, bias=None: x})
Triton = type("TritonInt8ScaledMMLinearKernel", (), {"apply_weights": lambda self, layer, x, bias=None: x})
TorchFP8 = type("PerTensorTorchFP8ScaledMMLinearKernel", (), {})


class _Scheme:
    def __init__(self, kernel=None, fp8_linear=None):
        if kernel is not None:
            self.kernel = kernel
        if fp8_linear is not None:
            self.fp8_linear = fp8_linear


class FakeLinear(nn.Module):
    def __init__(self, k: int, n: int, kernel) -> None:
        super().__init__()
        self.scheme = _Scheme(kernel=kernel)
        self.input_size_per_partition = k
        self.output_size_per_partition = n


def fake_model(n_layers: int = 2, kernel_cls=Cutlass, hidden: int = 128, odd: str | None = None) -> nn.Module:
    layers = nn.ModuleList()
    for _ in range(n_layers):
        attn, mlp = nn.Module(), nn.Module()
        attn.qkv_proj = FakeLinear(hidden, 2 * hidden, kernel_cls())
        attn.o_proj = FakeLinear(hidden, hidden, kernel_cls())
        mlp.gate_up_proj = FakeLinear(hidden, 6 * hidden, kernel_cls())
        mlp.down_proj = FakeLinear(3 * hidden if odd is None else 3 * hidden + 4, hidden, kernel_cls())
        mlp.act = nn.SiLU()  # no scheme: ignored
        layer = nn.Module()
        layer.self_attn, layer.mlp = attn, mlp
        layers.append(layer)
    inner = nn.Module()
    inner.layers = layers
    root = nn.Module()
    root.model = inner
    root.lm_head = nn.Linear(4, 4)  # unquantized
    return root


def test_layer_kernels_from_a_module_tree():
    m = fake_model()
    got = layer_kernels(m)
    assert len(got) == 8 and set(got.values()) == {"CutlassInt8ScaledMMLinearKernel"}
    assert "model.layers.1.self_attn.qkv_proj" in got and "lm_head" not in got
    m.model.layers[1].mlp.down_proj.scheme.kernel = Triton()
    assert layer_kernels(m)["model.layers.1.mlp.down_proj"] == "TritonInt8ScaledMMLinearKernel"


def test_layer_kernels_fp8_and_quant_method():
    root = nn.Module()
    root.a = nn.Module()
    root.a.scheme = _Scheme(fp8_linear=TorchFP8())
    root.b = nn.Module()
    root.b.quant_method = _Scheme(fp8_linear=TorchFP8())  # quantization="fp8": Fp8LinearMethod
    root.c = nn.Module()
    root.c.quant_method = object()  # an unquantized method: no kernel
    assert layer_kernels(root) == {"a": "PerTensorTorchFP8ScaledMMLinearKernel", "b": "PerTensorTorchFP8ScaledMMLinearKernel"}


def test_shapes_and_predicted_fallbacks():
    m = fake_model(odd="down")
    shapes = layer_gemm_shapes(m)
    assert shapes["model.layers.0.self_attn.qkv_proj"] == (128, 256)
    assert shapes["model.layers.0.mlp.down_proj"] == (388, 128)
    layers = layer_kernels(m)
    assert predicted_fallbacks(layers, shapes) == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    tri = {n: "TritonInt8ScaledMMLinearKernel" for n in layers}
    assert predicted_fallbacks(tri, shapes) == []  # only CUTLASS falls back


def test_layer_gemm_shapes_from_weight_layout():
    root = nn.Module()
    root.x = nn.Module()
    root.x.scheme = _Scheme(kernel=Cutlass())
    root.x.weight = torch.zeros(100, 48, dtype=torch.int8)  # [K, N] after process_weights_after_loading
    assert layer_gemm_shapes(root) == {"x": (100, 48)}


# -- call counting --------------------------------------------------------------------------------------


@pytest.fixture
def fake_ops(monkeypatch):
    """Fake vLLM op modules wired like the real ones: the CUTLASS entry looks the raw op and the
    Triton function up at call time, and falls back to Triton for K or N not a multiple of 16."""
    c_ns = types.ModuleType("fakevllm_c")
    triton_def = types.ModuleType("fakevllm_triton_def")
    kernel_mod = types.ModuleType("fakevllm_kernel_triton")
    custom = types.ModuleType("fakevllm_custom_ops")

    def raw(a, b):
        return ("cutlass", a, b)

    def triton_scaled_mm(a, b):
        return ("triton", a, b)

    c_ns.cutlass_scaled_mm = raw
    triton_def.triton_scaled_mm = triton_scaled_mm
    kernel_mod.triton_scaled_mm = triton_scaled_mm  # imported by name, as in vLLM (§4 option c)

    def entry(k, n):
        if kcuda.cutlass_falls_back(k, n):
            return sys.modules["fakevllm_triton_def"].triton_scaled_mm(k, n)
        return sys.modules["fakevllm_c"].cutlass_scaled_mm(k, n)

    custom.cutlass_scaled_mm = entry
    for mod in (c_ns, triton_def, kernel_mod, custom):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    targets = [
        ("fakevllm_c", "cutlass_scaled_mm", "cutlass"),
        ("fakevllm_custom_ops", "cutlass_scaled_mm", "cutlass_entry"),
        ("fakevllm_kernel_triton", "triton_scaled_mm", "triton"),
        ("fakevllm_triton_def", "triton_scaled_mm", "triton"),
        ("fakevllm_missing", "nothing", "torch"),
    ]
    return types.SimpleNamespace(custom=custom, kernel_mod=kernel_mod, c=c_ns, targets=targets, raw=raw)


def test_call_counter_counts_and_restores(fake_ops):
    counter = CallCounter(fake_ops.targets)
    with counter:
        assert fake_ops.custom.cutlass_scaled_mm(4096, 2048)[0] == "cutlass"
        assert fake_ops.custom.cutlass_scaled_mm(4096, 2050)[0] == "triton"  # silent fallback
        assert fake_ops.kernel_mod.triton_scaled_mm(1, 2)[0] == "triton"  # the Triton kernel class
    assert counter.counts == {"cutlass": 1, "cutlass_entry": 2, "triton": 2}
    assert counter.by_target["fakevllm_triton_def.triton_scaled_mm"] == 1
    assert counter.by_target["fakevllm_kernel_triton.triton_scaled_mm"] == 1
    assert counter.missing == ["fakevllm_missing.nothing"]
    assert fake_ops.c.cutlass_scaled_mm is fake_ops.raw  # restored
    fake_ops.custom.cutlass_scaled_mm(16, 16)
    assert counter.counts["cutlass"] == 1  # not counted outside the block
    with counter:  # counts accumulate across entries
        fake_ops.custom.cutlass_scaled_mm(16, 16)
    assert counter.counts["cutlass"] == 2
    counter.reset()
    assert counter.counts == {"cutlass": 0, "cutlass_entry": 0, "triton": 0}


def test_vllm_op_targets_per_version():
    new = vllm_op_targets("0.32.0")
    assert ("torch.ops._C", "cutlass_scaled_mm", "cutlass") in new
    assert ("vllm.model_executor.kernels.linear.scaled_mm.triton", "triton_scaled_mm", "triton") in new
    assert (kcuda.TRITON_SCALED_MM_MODULE, "triton_scaled_mm", "triton") in new
    old = vllm_op_targets("0.16.0")
    assert ("vllm.model_executor.layers.quantization.kernels.scaled_mm.triton", "triton_scaled_mm", "triton") in old


def test_call_counter_on_real_torch_attributes():
    """Patching torch.ops.<ns>.<op> and torch.<fn> works the way the engine uses it."""
    counter = CallCounter([("torch.ops.aten", "mm", "cutlass"), ("torch", "_scaled_mm", "torch")])
    with counter:
        torch.ops.aten.mm(torch.eye(2), torch.eye(2))
    assert counter.counts == {"cutlass": 1, "torch": 0} and counter.missing == []
    assert type(torch.ops.aten.mm).__name__ == "OpOverloadPacket"


# -- logprob structures -> rows ----------------------------------------------------------------------------

Logprob = namedtuple("Logprob", "logprob rank decoded_token")
Completion = namedtuple("Completion", "token_ids logprobs")
RequestOutput = namedtuple("RequestOutput", "prompt_token_ids outputs prompt_logprobs")


def _entry(row: torch.Tensor, k: int, extra: int | None = None) -> dict[int, Logprob]:
    """vLLM's dict for one position: the top-k (torch.topk, its own tie order) plus one token."""
    vals, ids = torch.topk(row, k)
    d = {int(i): Logprob(float(v), r + 1, None) for r, (v, i) in enumerate(zip(vals, ids, strict=True))}
    if extra is not None and extra not in d:
        d[extra] = Logprob(float(row[extra]), int((row > row[extra]).sum()) + 1, None)
    return d


def _logits(rows: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g).to(torch.bfloat16).to(torch.float32)  # ties are likely
    x[:, 7] = x[:, 3] = x.max(dim=1).values + 1.0  # a top-1 tie in every row: lower id first
    return x


def test_generation_rows_match_predict():
    top_k = 3
    lg = _logits(4)
    am, tk, tl, mg = predict(lg, top_k)
    outs = [RequestOutput([1, 2], [Completion(am, [_entry(r, top_k + 1) for r in lg])], None)]
    res = generation_from_outputs([[1, 2]], outs, top_k)
    assert res.tokens == [am] and res.topk_ids == [tk] and res.topk_logits == [tl] and res.margins == [mg]
    assert all(t[0] == 3 and t[1] == 7 for t in res.topk_ids[0])  # tie: lower id first
    assert res.margins[0][0] == 0.0 and res.info["argmax_mismatches"] == 0
    assert res.rows()[0].keys() == {"sequence", "position", "prompt_len", "token", "topk_ids", "topk_logits", "margin"}


def test_generation_margin_is_float64_of_fp32_values():
    d = {5: Logprob(1.0000001192092896, 1, None), 9: Logprob(1.0, 2, None), 2: Logprob(-3.0, 3, None)}
    res = generation_from_outputs([[0]], [RequestOutput([0], [Completion([5], [d])], None)], 2)
    assert res.topk_ids == [[[5, 9]]] and res.margins == [[2.0**-23]]


def test_generation_counts_non_greedy_tokens_and_refuses_short_entries():
    d = {5: Logprob(2.0, 1, None), 9: Logprob(1.0, 2, None)}
    res = generation_from_outputs([[0]], [RequestOutput([0], [Completion([9], [d])], None)], 2)
    assert res.info["argmax_mismatches"] == 1 and res.info["first_argmax_mismatch"] == [0, 0]
    with pytest.raises(VllmEngineError, match="2 logprob entries, 3 needed"):
        generation_from_outputs([[0]], [RequestOutput([0], [Completion([5], [d])], None)], 3)
    with pytest.raises(VllmEngineError, match="another prompt"):
        generation_from_outputs([[1]], [RequestOutput([0], [Completion([5], [d])], None)], 2)
    with pytest.raises(VllmEngineError, match="logprob entries for 1 tokens"):
        generation_from_outputs([[0]], [RequestOutput([0], [Completion([5], None)], None)], 2)


def _teacher_forced_output(seq: list[int], lg: torch.Tensor, k: int, log_softmax: bool = False) -> RequestOutput:
    """What vLLM returns for prompt = seq, max_tokens=1, prompt_logprobs=k, logprobs=k (prompt
    entries as log-probabilities with ``log_softmax``, as vLLM's runner computes them)."""
    plg = torch.log_softmax(lg, dim=-1) if log_softmax else lg
    pl = [None] + [_entry(plg[i - 1], k, extra=seq[i]) for i in range(1, len(seq))]
    last = lg[len(seq) - 1]
    nxt = int(predict(last.unsqueeze(0), 1)[0][0])
    return RequestOutput(seq, [Completion([nxt], [_entry(last, k, extra=nxt)])], pl)


def test_score_rows_from_prompt_logprobs_and_from_logits_agree():
    top_k = 2
    seqs = [[3, 11, 42, 0, 7], [5, 6]]
    logits = [_logits(len(s), seed=i) for i, s in enumerate(seqs)]
    outs = [_teacher_forced_output(s, lg, top_k + 1) for s, lg in zip(seqs, logits, strict=True)]
    a = score_from_prompt_logprobs(seqs, outs, top_k)
    b = score_from_logits(seqs, logits, top_k)
    for f in ("argmax", "topk_ids", "topk_logits", "margins", "targets"):
        assert [x.tolist() for x in getattr(a, f)] == [y.tolist() for y in getattr(b, f)], f
    for x, y in zip(a.target_logits, b.target_logits, strict=True):
        assert x[:-1].tolist() == y[:-1].tolist() and math.isnan(x[-1]) and math.isnan(y[-1])
    assert a.targets[0].tolist() == [11, 42, 0, 7, -1] and a.target_logits[0][0] == float(logits[0][0, 11])
    am, tk, _, mg = predict(logits[0], top_k)  # the CPU engine's ranking, row for row
    assert b.argmax[0].tolist() == am and b.topk_ids[0].tolist() == tk and b.margins[0].tolist() == mg
    # the engine's logprobs_mode is raw_logits, and vLLM's prompt scores follow it: raw logits, so labelled
    assert a.info["values"] == "raw_logits" and b.info["values"] == "raw_logits"
    assert score_from_prompt_logprobs(seqs, outs, top_k, prompt_values="logprobs").info["values"] == "logprobs"
    assert len(a.rows()) == 7


def test_score_from_prompt_logprobs_checks_vllm_conventions():
    seq = [1, 2, 3]
    out = _teacher_forced_output(seq, _logits(3), 3)
    with pytest.raises(VllmEngineError, match=r"prompt_logprobs\[0\] must be None"):
        score_from_prompt_logprobs([seq], [out._replace(prompt_logprobs=[{}, *out.prompt_logprobs[1:]])], 2)
    with pytest.raises(VllmEngineError, match="2 prompt logprob entries for 3 tokens"):
        score_from_prompt_logprobs([seq], [out._replace(prompt_logprobs=out.prompt_logprobs[:2])], 2)
    bad = [None] + [{t: lp for t, lp in e.items() if t != seq[i + 1]} for i, e in enumerate(out.prompt_logprobs[1:])]
    with pytest.raises(VllmEngineError, match="missing from its prompt logprobs"):
        score_from_prompt_logprobs([seq], [out._replace(prompt_logprobs=bad)], 2)


def test_assemble_logits_finds_prompt_and_last_rows_in_any_order():
    seq = [4, 9, 1, 30]
    lg = _logits(4)
    out = _teacher_forced_output(seq, lg, 3, log_softmax=True)
    gen = out.outputs[0].token_ids[0]
    for caps in ([lg[3:], lg[:3]], [lg[:3], lg[3:]], [lg]):
        assert torch.equal(assemble_logits(caps, 4, gen, out.prompt_logprobs, prompt_values="logprobs"), lg)
    with pytest.raises(VllmEngineError, match=r"row counts \[2\]"):
        assemble_logits([lg[:2]], 4, gen, out.prompt_logprobs, prompt_values="logprobs")
    with pytest.raises(VllmEngineError, match="argmax"):
        assemble_logits([lg[:3], -lg[3:]], 4, gen, out.prompt_logprobs, prompt_values="logprobs")


def test_assemble_logits_two_tokens_disambiguated_by_logprobs():
    seq = [4, 9]
    lg = _logits(2, seed=3)
    out = _teacher_forced_output(seq, lg, 3, log_softmax=True)
    gen = out.outputs[0].token_ids[0]
    for caps in ([lg[1:], lg[:1]], [lg[:1], lg[1:]]):  # two one-row captures
        assert torch.equal(assemble_logits(caps, 2, gen, out.prompt_logprobs, prompt_values="logprobs"), lg)


def test_assemble_logits_two_tokens_disambiguated_by_raw_logit_prompt_entries():
    """Issue #37: under the engine's logprobs_mode="raw_logits", vLLM's prompt entries are raw logits
    (both runners, 0.29-0.32); comparing them with a log-softmax had rejected every candidate."""
    seq = [4, 9]
    lg = _logits(2, seed=3)
    out = _teacher_forced_output(seq, lg, 3, log_softmax=False)
    gen = out.outputs[0].token_ids[0]
    for caps in ([lg[1:], lg[:1]], [lg[:1], lg[1:]]):
        assert torch.equal(assemble_logits(caps, 2, gen, out.prompt_logprobs), lg)
    with pytest.raises(VllmEngineError, match="could not find the logits"):
        assemble_logits([lg[1:], lg[:1]], 2, gen, out.prompt_logprobs, prompt_values="logprobs")


# -- evidence ----------------------------------------------------------------------------------------


def _evidence(**over):
    f = forcing(over.pop("family", "cutlass"), "0.32.0")
    cls = f["expected_classes"][0]
    layers = {f"model.layers.{i}.mlp.down_proj": cls for i in range(2)}
    kw = {
        "log_pairs": [(cls, "CompressedTensorsW8A8Int8")],
        "layers": layers,
        "layer_calls": {n: {cls: 3} for n in layers},
        "op_calls": {f["expected_op"]: 6, "cutlass_entry": 6, "triton": 0, "torch": 0},
    }
    kw.update(over)
    return check_evidence(f, **kw)


def test_evidence_ok():
    ev = _evidence()
    assert ev["ok"] and ev["problems"] == [] and ev["layer_kernels"] == {"CutlassInt8ScaledMMLinearKernel": 2}
    assert require_evidence(ev) is ev
    assert _evidence(family="triton", op_calls={"triton": 4, "cutlass": 0})["ok"]


@pytest.mark.parametrize(
    "over,match",
    [
        ({"log_pairs": [("TritonInt8ScaledMMLinearKernel", "CompressedTensorsW8A8Int8")]}, "vLLM logged selecting TritonInt8"),
        ({"log_pairs": []}, "no 'Selected ... for ...' kernel-selection line"),
        ({"layers": {"a": "TritonInt8ScaledMMLinearKernel", "b": "CutlassInt8ScaledMMLinearKernel"}}, "1 of 2 layers selected another kernel class"),
        ({"layers": {}}, "no quantized linear layer found"),
        ({"layer_calls": {"a": {"CutlassInt8ScaledMMLinearKernel": 0}}}, "1 W8A8 layers never ran"),
        ({"layer_calls": {"a": {"TritonInt8ScaledMMLinearKernel": 2}}}, "but the layers ran"),
        ({"op_calls": {"cutlass": 0, "triton": 5}}, "run-time op calls"),
    ],
)
def test_evidence_mismatch_is_a_clear_error(over, match):
    ev = _evidence(**over)
    assert not ev["ok"]
    with pytest.raises(KernelEvidenceError, match=match) as exc:
        require_evidence(ev)
    assert "configured kernel 'cutlass-int8'" in str(exc.value) and "must not count" in str(exc.value)


def test_evidence_names_the_silent_fallback():
    m = fake_model(odd="down")
    layers = layer_kernels(m)
    ev = check_evidence(
        forcing("cutlass", "0.32.0"), log_pairs=[("CutlassInt8ScaledMMLinearKernel", "CompressedTensorsW8A8Int8")],
        layers=layers, op_calls={"cutlass": 6, "triton": 2}, shapes=layer_gemm_shapes(m),
    )
    assert not ev["ok"] and ev["predicted_fallbacks"] == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    assert "Pitfall 1" in ev["problems"][0] and "in 2 layers" in ev["problems"][0]


def test_evidence_optional_sources():
    ev = _evidence(log_pairs=[], layer_calls=None, op_calls=None, require_log=False)
    assert ev["ok"] and ev["layer_calls"] is None
    ev = _evidence(hooks_missing=["torch.ops._C.cutlass_scaled_mm"], op_calls={"cutlass": 0, "triton": 0})
    assert any("could not count calls of the cutlass op" in p for p in ev["problems"])
    fp8 = forcing("torch", "0.32.0")
    ev = check_evidence(fp8, log_pairs=[("ChannelWiseTorchFP8ScaledMMLinearKernel", "CompressedTensorsW8A8Fp8")],
                        layers={"a": "ChannelWiseTorchFP8ScaledMMLinearKernel", "b": "PerTensorTorchFP8ScaledMMLinearKernel"},
                        layer_calls={"a": {"ChannelWiseTorchFP8ScaledMMLinearKernel": 1}, "b": {"PerTensorTorchFP8ScaledMMLinearKernel": 1}},
                        op_calls={"torch": 2, "cutlass": 0})
    assert ev["ok"], ev["problems"]


def test_counted_fake_forward_pass_feeds_the_evidence(fake_ops):
    """End to end on fakes: layers call the CUTLASS entry; unaligned ones end up in Triton."""
    m = fake_model(odd="down")
    counter = CallCounter(fake_ops.targets)
    with counter:
        for k, n in layer_gemm_shapes(m).values():
            fake_ops.custom.cutlass_scaled_mm(k, n)
    ev = check_evidence(forcing("cutlass", "0.30.0"), log_pairs=None, layers=layer_kernels(m),
                        op_calls=counter.counts, hooks_missing=counter.missing, shapes=layer_gemm_shapes(m))
    assert counter.counts["cutlass"] == 6 and counter.counts["triton"] == 2
    with pytest.raises(KernelEvidenceError, match="Pitfall 1"):
        require_evidence(ev)


# -- layer names and fused layers -----------------------------------------------------------------------


def test_vllm_layer_name():
    assert vllm_layer_name("model.layers.3.self_attn.qkv_proj") == ("layers.3.self_attn.qkv_proj", 3, "qkv")
    assert vllm_layer_name("model.layers.0.mlp.down_proj") == ("layers.0.mlp.down_proj", 0, "down")
    assert vllm_layer_name("model.layers.12.mlp.gate_up_proj") == ("layers.12.mlp.gate_up_proj", 12, "gate_up")
    assert vllm_layer_name("lm_head") == ("lm_head", -1, "lm_head")


def _fused_capture(bias: bool) -> CapturedLayer:
    g = torch.Generator().manual_seed(1)
    m, k, sizes = 5, 64, (32, 16, 16)
    n = sum(sizes)
    x_q = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    w_q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    xs = torch.rand(m, 1, generator=g) / 100
    ws = torch.rand(n, generator=g) / 100
    b = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
    kern = get_kernel("int8-cutlass-order")
    out = kern(x_q, w_q.t(), xs, ws, torch.bfloat16, b)
    return CapturedLayer("layers.2.self_attn.qkv_proj", 2, "qkv", x_q, xs, w_q, ws, b, out, "int8-cutlass-order")


@pytest.mark.parametrize("bias", [False, True])
def test_split_fused_parts_replay_bit_for_bit(bias):
    c = _fused_capture(bias)
    calls: dict[str, int] = {}
    parts = split_fused(c, [32, 16, 16], calls)
    assert [p.name for p in parts] == ["layers.2.self_attn.q_proj", "layers.2.self_attn.k_proj", "layers.2.self_attn.v_proj"]
    assert [p.layer_type for p in parts] == ["q", "k", "v"] and [p.n for p in parts] == [32, 16, 16]
    for p in parts:
        assert torch.equal(p.replay().view(torch.int16), p.output.view(torch.int16))  # the slice is the small GEMM
    assert split_fused(c, [32, 16, 16], calls)[0].call == 1  # a second call of the same layer
    assert split_fused(c, [40, 40], calls) == [c]  # sizes that do not match: left as is


# -- GPU kernels: availability, fallback rule, layouts ---------------------------------------------------


def test_gpu_kernels_listed_unavailable_with_reason_here():
    rows = {r["name"]: r for r in list_kernels()}
    for name in GPU_KERNELS:
        r = rows[name]
        assert r["device"] == "cuda" and r["available"] is False, r
        if not torch.cuda.is_available():
            assert "CUDA not available" in r["reason"]
    for name in ("vllm-cutlass", "vllm-cutlass-raw", "vllm-triton"):
        if kcuda.vllm_version() is None:
            assert "vllm not installed" in rows[name]["reason"]
    assert "vllm" not in rows["torch-scaled-mm-cuda"]["reason"]


def test_kernels_list_json_cli():
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    res = CliRunner().invoke(app, ["kernels", "list", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)}
    for name in GPU_KERNELS:
        assert rows[name]["available"] is False and rows[name]["reason"]


def test_availability_reasons(monkeypatch):
    k = get_kernel("vllm-triton")
    monkeypatch.setattr(kcuda, "cuda_reason", lambda: None)
    monkeypatch.setattr(kcuda, "vllm_version", lambda: "0.28.0")
    ok, reason = k.available()
    assert not ok and "vllm 0.28.0 is installed; swapcheck supports vllm 0.29-0.32" in reason
    monkeypatch.setattr(kcuda, "vllm_version", lambda: "0.33.0")
    assert "0.29-0.32" in k.available()[1]
    monkeypatch.setattr(kcuda, "vllm_version", lambda: "0.32.0")
    if kcuda.importlib.util.find_spec("vllm") is None:
        ok, reason = k.available()
        assert not ok and "not importable" in reason
    assert kcuda.vllm_reason(installed=False).startswith("vllm not installed")
    assert kcuda.vllm_reason("0.31.2", installed=True) is None


def test_fallback_rule():
    assert not kcuda.cutlass_falls_back(4096, 2048)
    assert kcuda.cutlass_falls_back(4100, 2048) and kcuda.cutlass_falls_back(4096, 2056 + 1)
    assert kcuda.cutlass_falls_back(4096, 2048, rocm=True)
    assert kcuda.fallback_reason(64, 64) is None
    assert kcuda.fallback_reason(100, 24).startswith("K=100 and N=24 not a multiple of 16")
    cut = get_kernel("vllm-cutlass")
    assert cut.last_fallback is None and cut.fallback_calls == 0
    assert cut.runs(128, 256) == "cutlass" and cut.runs(130, 256) == "triton"
    assert cut.cpu_counterpart(128, 256) == {"kernel": "int8-cutlass-order", "params": {}}
    assert cut.cpu_counterpart(130, 256)["kernel"] == "int8-triton-order"
    raw = get_kernel("vllm-cutlass-raw")
    ok, reason = raw.supports(8, 24, 64, 8, 24, False)
    assert not ok and "N=24" in reason and "Pitfall 1" in reason
    assert raw.supports(8, 32, 64, 8, 32, True) == (True, None)
    ok, reason = get_kernel("torch-scaled-mm-cuda").supports(8, 32, 40, 1, 1, False)
    assert not ok and "K=40" in reason
    assert kcuda.triton_bias_mode("0.31.0") == "output" and kcuda.triton_bias_mode("0.32.0") == "fp32"
    assert get_kernel("torch-scaled-mm-cuda", use_fast_accum=True).params == {"use_fast_accum": True, "device": "cuda"}
    with pytest.raises(KernelError, match="use_fast_accum must be True or False"):
        get_kernel("torch-scaled-mm-cuda", use_fast_accum="yes")


def _ops(per_tensor: bool, bias: bool):
    m, k, n = 3, 32, 48
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8)
    b = torch.randint(-127, 128, (k, n), dtype=torch.int8)  # row-major: must be converted
    sa = torch.tensor(0.5) if per_tensor else torch.rand(m)
    sb = torch.tensor([0.25]) if per_tensor else torch.rand(n)
    bb = torch.randn(n).to(torch.bfloat16) if bias else None
    return check_operands(get_kernel("int8-cutlass-order"), a, b, sa, sb, torch.bfloat16, bb)


@pytest.mark.parametrize("per_tensor", [False, True])
def test_vllm_operand_layouts(per_tensor):
    ops = _ops(per_tensor, bias=True)
    row = kcuda.vllm_operands(ops, "row")
    col = kcuda.vllm_operands(ops, "col")
    assert row["b"].stride(0) == 1 and torch.equal(row["b"], ops.b)  # column-major [K, N]
    assert row["a"].is_contiguous() and row["bias"].dtype == torch.bfloat16
    for o in (row, col):
        assert o["scale_a"].dtype == torch.float32 and o["scale_a"].is_contiguous()
        assert o["scale_b"].is_contiguous()
    if per_tensor:
        assert row["scale_a"].shape == (1, 1) and row["scale_b"].shape == (1, 1) and col["scale_b"].shape == (1, 1)
    else:
        assert row["scale_a"].shape == (3, 1) and row["scale_b"].shape == (1, 48) and col["scale_b"].shape == (48, 1)
        assert torch.equal(col["scale_b"].reshape(-1), row["scale_b"].reshape(-1))
    with pytest.raises(ValueError, match="scale_b_layout"):
        kcuda.vllm_operands(ops, "diag")


def _fp32_call():
    a = torch.ones(2, 16, dtype=torch.int8)
    b = torch.ones(16, 16, dtype=torch.int8)
    return a, b, torch.tensor(1.0), torch.tensor(1.0), torch.float32, None


def test_vllm_ops_refuse_fp32_output():
    ops = check_operands(get_kernel("int8-cutlass-order"), *_fp32_call())
    with pytest.raises(KernelError, match="bfloat16 or torch.float16 only"):
        kcuda._vllm_out_dtype("vllm-cutlass", ops)


def test_gpu_kernel_refuses_cpu_operands():
    a, b, sa, sb, _, _ = _fp32_call()
    with pytest.raises(KernelError, match="runs on 'cuda'"):
        get_kernel("vllm-cutlass")(a, b, sa, sb, torch.bfloat16)


def test_engine_refuses_here_with_the_reason():
    reason = runtime_reason()
    if reason is None:
        pytest.skip("CUDA and vLLM are present: tests/test_gpu.py covers the engine")
    with pytest.raises(VllmEngineError, match="cannot run here") as exc:
        VllmEngine("/nonexistent", kernel="triton")
    assert reason in str(exc.value)


def test_no_vllm_import_at_module_import():
    code = ("import sys, tasks.kernels, tasks.models.vllm_engine, tasks.kernels.cuda; "
            "print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


def test_gpu_kit_without_cuda_refuses_gpu_mode(tmp_path: Path):
    """The GPU kit (which replaced benchmarks/gpu_smoke.py) says so and writes only the device's identity."""
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the kit would run for real")
    out = tmp_path / "kit"
    res = subprocess.run(["bash", "infra/gpu-kit/run.sh", str(out)], capture_output=True, text=True, cwd=REPO,
                         timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert res.returncode == 2, res.stdout + res.stderr
    assert "no CUDA device here; run with --cpu" in res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["device.json", "kit.log"]


def test_assemble_logits_joins_the_1024_row_prompt_chunks_of_a_long_sequence():
    """Issue #37: vLLM 0.32's V2 runner computes prompt logits 1024 rows at a time, so a 2,500-token
    sequence is captured as rows 1024, 1024, 451 and the sampled position's 1 row."""
    n = 2500
    lg = _logits(n, vocab=12, seed=5)
    seq = [int(t) for t in torch.randint(0, 12, (n,), generator=torch.Generator().manual_seed(1))]
    out = _teacher_forced_output(seq, lg, 3)
    gen = out.outputs[0].token_ids[0]
    chunks = [lg[0:1024], lg[1024:2048], lg[2048:n - 1]]
    for caps in ([*chunks, lg[n - 1:]], [lg[n - 1:], *chunks]):
        assert torch.equal(assemble_logits(caps, n, gen, out.prompt_logprobs), lg)
