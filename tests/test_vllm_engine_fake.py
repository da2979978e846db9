"""VllmEngine's plumbing on the CPU, against a fake ``vllm`` package.

The fake is small but wired like vLLM 0.32 where the engine depends on it (docs/reference/vllm-kernels.md):
``LLM`` picks the first INT8 kernel class not named in ``VLLM_DISABLED_KERNELS`` (§1.2) and logs
``Selected <class> for CompressedTensorsW8A8Int8`` (§1.3); every quantized layer has
``scheme.kernel`` whose ``apply_weights`` quantizes per token and calls
``vllm._custom_ops.cutlass_scaled_mm`` (which falls back to Triton for unaligned K or N) or the
kernel module's ``triton_scaled_mm`` (§4); outputs carry ``Logprob`` dicts and ``prompt_logprobs``
with entry 0 None (§5); the model is reachable through ``llm_engine.model_executor.driver_worker
.worker.model_runner.get_model()`` (§4) and computes logits with ``compute_logits``.

This checks what the engine does with that shape -- forcing, the three evidence sources, the
mismatch error, rows, teacher-forced logits, captures and their replay -- not vLLM itself
(tests/test_gpu.py does, on a GPU).
"""

from __future__ import annotations

import logging
import sys
import types
from collections import namedtuple

import pytest
import torch
from torch import nn

import tasks.models.vllm_engine as ve
from tasks.kernels import get_kernel
from tasks.kernels.cuda import cutlass_falls_back
from tasks.models.quantization import quantize_activations

Logprob = namedtuple("Logprob", "logprob rank decoded_token")
Completion = namedtuple("Completion", "token_ids logprobs")
RequestOutput = namedtuple("RequestOutput", "prompt_token_ids outputs prompt_logprobs")
VOCAB, HIDDEN = 64, 32


def _fake_vllm(monkeypatch, down_k: int = 2 * HIDDEN) -> types.SimpleNamespace:
    custom = types.ModuleType("vllm._custom_ops")
    raw_ns = types.ModuleType("fakevllm_raw")
    triton_mod = types.ModuleType("fakevllm_triton")

    def cutlass_raw(a, b, sa, sb, out_dtype, bias=None):
        return get_kernel("int8-cutlass-order")(a, b, sa, sb, out_dtype, bias)

    def triton_scaled_mm(a, b, sa, sb, out_dtype, bias=None):
        return get_kernel("int8-triton-order")(a, b, sa, sb, out_dtype, bias)

    def cutlass_scaled_mm(a, b, sa, sb, out_dtype, bias=None):
        if cutlass_falls_back(b.shape[0], b.shape[1]):  # §1.2 Pitfall 1
            return sys.modules["fakevllm_triton"].triton_scaled_mm(a, b, sa, sb, out_dtype, bias)
        return sys.modules["fakevllm_raw"].cutlass_scaled_mm(a, b, sa, sb, out_dtype, bias)

    def scaled_int8_quant(x, scale=None, azp=None, symmetric=True):
        q, s = quantize_activations(x, "real")
        return q, s, None

    raw_ns.cutlass_scaled_mm = cutlass_raw
    triton_mod.triton_scaled_mm = triton_scaled_mm
    custom.cutlass_scaled_mm = cutlass_scaled_mm
    custom.scaled_int8_quant = scaled_int8_quant

    class _Int8Kernel:
        def apply_weights(self, layer, x, bias=None):
            x2 = x.reshape(-1, x.shape[-1])
            q, s, _ = sys.modules["vllm._custom_ops"].scaled_int8_quant(x2.contiguous(), layer.input_scale, None)
            return self.mm(q, layer.weight, s, layer.weight_scale, torch.bfloat16, bias)

    class CutlassInt8ScaledMMLinearKernel(_Int8Kernel):
        def mm(self, *args):
            return sys.modules["vllm._custom_ops"].cutlass_scaled_mm(*args)

    class TritonInt8ScaledMMLinearKernel(_Int8Kernel):
        def mm(self, *args):
            return sys.modules["fakevllm_triton"].triton_scaled_mm(*args)

    classes = [CutlassInt8ScaledMMLinearKernel, TritonInt8ScaledMMLinearKernel]

    class Scheme:
        def __init__(self, kernel):
            self.kernel = kernel

    class Linear(nn.Module):
        def __init__(self, k, n, kernel_cls, gen, output_sizes=None):
            super().__init__()
            w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
            self.weight = w.t()  # [K, N] column-major view, as after process_weights_after_loading
            self.weight_scale = (torch.rand(n, 1, generator=gen) / 100).contiguous()
            self.input_scale = None
            self.input_size_per_partition, self.output_size_per_partition = k, n
            if output_sizes is not None:
                self.output_sizes = output_sizes
            self.scheme = Scheme(kernel_cls())

        def forward(self, x):
            return self.scheme.kernel.apply_weights(self, x, None)

    class Model(nn.Module):
        def __init__(self, kernel_cls):
            super().__init__()
            gen = torch.Generator().manual_seed(0)
            self.embed = torch.randn(VOCAB, HIDDEN, generator=gen)
            self.lm = torch.randn(HIDDEN, VOCAB, generator=gen)
            self.model = nn.Module()
            self.model.layers = nn.ModuleList()
            for _ in range(2):
                layer = nn.Module()
                layer.self_attn, layer.mlp = nn.Module(), nn.Module()
                layer.self_attn.qkv_proj = Linear(HIDDEN, 2 * HIDDEN, kernel_cls, gen, [HIDDEN, HIDDEN // 2, HIDDEN // 2])
                layer.mlp.down_proj = Linear(down_k, HIDDEN, kernel_cls, gen)
                self.model.layers.append(layer)

        def hidden(self, ids):
            h = self.embed[torch.tensor(ids)]
            for layer in self.model.layers:
                qkv = layer.self_attn.qkv_proj(h.to(torch.bfloat16)).float()
                h = h + qkv[:, :HIDDEN]
                pad = torch.zeros(h.shape[0], layer.mlp.down_proj.input_size_per_partition - HIDDEN)
                h = h + layer.mlp.down_proj(torch.cat([h, pad], 1).to(torch.bfloat16)).float()
            return h

        def compute_logits(self, h):
            return h @ self.lm

    class SamplingParams:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    def entry(row, k, extra=None):
        vals, ids = torch.topk(row, k)
        d = {int(i): Logprob(float(v), r + 1, None) for r, (v, i) in enumerate(zip(vals, ids, strict=True))}
        if extra is not None and extra not in d:
            d[extra] = Logprob(float(row[extra]), 0, None)
        return d

    class LLM:
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            disabled = __import__("os").environ.get("VLLM_DISABLED_KERNELS", "").split(",")
            cls = next(c for c in classes if c.__name__ not in disabled)
            logging.getLogger("vllm.model_executor.kernels.linear").info(
                "Selected %s for %s", cls.__name__, "CompressedTensorsW8A8Int8")
            self.model = Model(cls)
            runner = types.SimpleNamespace(get_model=lambda: self.model)
            worker = types.SimpleNamespace(model_runner=runner)
            self.llm_engine = types.SimpleNamespace(model_executor=types.SimpleNamespace(
                driver_worker=types.SimpleNamespace(worker=worker)),
                model_config=types.SimpleNamespace(get_vocab_size=lambda: VOCAB))
            self.logprobs_mode = kwargs.get("logprobs_mode", "raw_logprobs")

        def generate(self, reqs, sp, use_tqdm=True):
            outs = []
            for r in reqs:
                seq = list(r["prompt_token_ids"])
                prompt_rows = self.model.compute_logits(self.model.hidden(seq))  # all positions
                pl = None
                if getattr(sp, "prompt_logprobs", None):
                    # vLLM's runners score prompts "respecting logprobs_mode": raw logits under raw_logits
                    rows = self.model.compute_logits(self.model.hidden(seq)[:-1])
                    lsm = rows if self.logprobs_mode == "raw_logits" else torch.log_softmax(rows, -1)
                    pl = [None] + [entry(lsm[i - 1], sp.prompt_logprobs, seq[i]) for i in range(1, len(seq))]
                toks, lps = [], []
                last = prompt_rows[-1:]
                for _ in range(sp.max_tokens):
                    row = self.model.compute_logits(self.model.hidden(seq + toks)[-1:])[0] if toks else last[0]
                    tok = int(torch.argmax(row))
                    toks.append(tok)
                    lps.append(entry(row, sp.logprobs, tok))
                outs.append(RequestOutput(seq, [Completion(toks, lps)], pl))
            return outs

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, SamplingParams
    vllm._custom_ops = custom
    for name, mod in (("vllm", vllm), ("vllm._custom_ops", custom), ("fakevllm_raw", raw_ns),
                      ("fakevllm_triton", triton_mod)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(ve, "runtime_reason", lambda: None)
    monkeypatch.setattr(ve, "vllm_version", lambda: "0.32.0")
    monkeypatch.setattr(ve, "vllm_op_targets", lambda v: [
        ("fakevllm_raw", "cutlass_scaled_mm", "cutlass"),
        ("vllm._custom_ops", "cutlass_scaled_mm", "cutlass_entry"),
        ("fakevllm_triton", "triton_scaled_mm", "triton"),
    ])
    monkeypatch.setattr(ve, "_PROCESS_ENGINES", [])
    for var in ("VLLM_DISABLED_KERNELS", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL"):
        monkeypatch.setenv(var, "")  # the engine sets them; monkeypatch restores the old state
        monkeypatch.delenv(var)
    return types.SimpleNamespace(classes=classes)


@pytest.fixture
def gpu_torch(monkeypatch):
    """identity() asks torch.cuda for the device; answer as a GPU would."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))


@pytest.mark.parametrize("family,cls,op", [("cutlass", "CutlassInt8ScaledMMLinearKernel", "cutlass"),
                                           ("triton", "TritonInt8ScaledMMLinearKernel", "triton")])
def test_engine_forces_generates_and_shows_evidence(monkeypatch, gpu_torch, family, cls, op):
    _fake_vllm(monkeypatch)
    eng = ve.VllmEngine("/models/fake", kernel=family, max_model_len=64, max_logprobs=6)
    assert eng.llm.kwargs["enforce_eager"] is True and eng.llm.kwargs["logprobs_mode"] == "raw_logits"
    assert eng.llm.kwargs["max_num_batched_tokens"] == 64 and eng.llm.kwargs["skip_tokenizer_init"] is True
    import os

    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    gen = eng.generate([[1, 2, 3], [4, 5]], max_new_tokens=3, top_k=3)
    assert [len(t) for t in gen.tokens] == [3, 3] and len(gen.topk_ids[0][0]) == 3
    ev = eng.require_evidence()
    assert ev["log"] == [[cls, "CompressedTensorsW8A8Int8"]]
    assert ev["layer_kernels"] == {cls: 4}
    assert ev["op_calls"][op] > 0 and sum(v for k, v in ev["op_calls"].items() if k in ("cutlass", "triton") and k != op) == 0
    assert set(eng.kernel_calls()) == {f"model.layers.{i}.{p}" for i in range(2) for p in ("self_attn.qkv_proj", "mlp.down_proj")}
    ident = eng.identity()
    assert ident["engine"] == "vllm" and ident["kernel"] == f"{family}-int8" and ident["device_name"] == "Fake GPU"


def test_engine_scores_with_raw_logits_like_the_cpu_engine(monkeypatch, gpu_torch):
    _fake_vllm(monkeypatch)
    eng = ve.VllmEngine("/models/fake", kernel="triton", max_logprobs=6)
    gen = eng.generate([[1, 2, 3]], max_new_tokens=4, top_k=2)
    seqs = gen.sequences()
    by_logits = eng.score(seqs, top_k=2)
    by_logprobs = eng.score(seqs, top_k=2, values="logprobs")
    model = eng.module
    want = ve.score_from_logits(seqs, [model.compute_logits(model.hidden(seqs[0]))], 2)
    def lists(arrays):
        return [a.tolist() for a in arrays]

    assert lists(by_logits.topk_ids) == lists(want.topk_ids) and lists(by_logits.margins) == lists(want.margins)
    assert lists(by_logits.argmax) == lists(by_logprobs.argmax)
    assert by_logits.argmax[0][2:6].tolist() == gen.tokens[0]  # teacher forcing reproduces greedy decoding
    # values="logprobs" reads vLLM's prompt entries, which follow the engine's logprobs_mode: raw logits,
    # labelled so (issue #37: they had been labelled "logprobs")
    assert by_logprobs.info["values"] == "raw_logits" and by_logits.info["values"] == "raw_logits"


def test_engine_capture_replays_bit_for_bit(monkeypatch, gpu_torch):
    _fake_vllm(monkeypatch)
    eng = ve.VllmEngine("/models/fake", kernel="cutlass", max_logprobs=6)
    with eng.capture() as cap:
        eng.generate([[1, 2, 3]], max_new_tokens=2, top_k=2)
    names = sorted({c.name for c in cap.layers})
    assert names == sorted(f"layers.{i}.{p}" for i in range(2) for p in
                           ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.down_proj"))
    assert {c.kernel for c in cap.layers} == {"vllm-cutlass"}
    for c in cap.layers:  # the CPU emulation of CUTLASS stands in for the GPU kernel here
        got = get_kernel("int8-cutlass-order")(c.x_q, c.w_q.t(), c.x_scale, c.w_scale, c.output.dtype, c.bias)
        assert torch.equal(got.view(torch.int16), c.output.view(torch.int16)), c.key
    assert max(c.call for c in cap.layers) == 1  # prefill, then one decode step
    assert cap.meta["engine"] == "vllm"


def test_engine_mismatch_fails_the_unit(monkeypatch, gpu_torch):
    _fake_vllm(monkeypatch, down_k=2 * HIDDEN + 8)  # down_proj K not a multiple of 16
    eng = ve.VllmEngine("/models/fake", kernel="cutlass", max_logprobs=6)
    eng.generate([[1, 2]], max_new_tokens=1, top_k=2)
    with pytest.raises(ve.KernelEvidenceError, match="Pitfall 1") as exc:
        eng.require_evidence()
    assert "model.layers.0.mlp.down_proj" in str(exc.value)


def test_engine_refuses_a_second_kernel_in_one_process(monkeypatch, gpu_torch):
    _fake_vllm(monkeypatch)
    ve.VllmEngine("/models/fake", kernel="cutlass", max_logprobs=6)
    with pytest.raises(ve.VllmEngineError, match="fresh process"):
        ve.VllmEngine("/models/fake", kernel="triton", max_logprobs=6)
    again = ve.VllmEngine("/models/fake", kernel="cutlass", max_logprobs=6)
    assert again.require_log is False  # info_once already logged in this process


def test_engine_top_k_within_max_logprobs(monkeypatch, gpu_torch):
    _fake_vllm(monkeypatch)
    eng = ve.VllmEngine("/models/fake", kernel="cutlass", max_logprobs=4)
    with pytest.raises(ve.VllmEngineError, match="max_logprobs >= 5"):
        eng.generate([[1]], max_new_tokens=1, top_k=4)
