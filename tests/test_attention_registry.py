"""The attention-kernel registry (tasks/attention), `swapcheck kernels attention` and `check attention`.

Every CPU kernel runs for real (torch on the CPU) and is checked against a float64 reference and
against the attention algorithms of tasks/numerics/attention.py; a planted kernel that accumulates
P V in bfloat16 must fail the `plain` algorithm.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tasks.attention import (
    AttentionError,
    AttentionKernel,
    attention_names,
    get_attention,
    list_attention,
)
from tasks.attention import registry as reg
from tasks.attention.cpu import logsumexp_alongside
from tasks.checks.attention import (
    INPUT_KINDS,
    draw,
    parse_algorithm,
    reference,
    run_attention_check,
)
from tasks.checks.subject import CheckInputError

runner = CliRunner()
CPU = ("eager", "fp64", "sdpa-flash-cpu", "sdpa-math")
GPU = ("vllm-flash-attn", "vllm-flashinfer", "vllm-flex-attention", "vllm-triton-attn")


def _operands(dtype: torch.dtype = torch.float32, kv_heads: int = 2, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((2, 4, 9, 16), generator=g)
    k = torch.randn((2, kv_heads, 13, 16), generator=g)
    v = torch.randn((2, kv_heads, 13, 16), generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _f64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
         scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 attention written out here (not the registry's): softmax(q kT * scale + mask) v."""
    rep = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(rep, dim=1)
    v64 = v.double().repeat_interleave(rep, dim=1)
    s = q.double() @ k64.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    return torch.softmax(s, -1) @ v64, torch.logsumexp(s, -1)


def test_registry_lists_cpu_and_gpu_entries() -> None:
    assert set(CPU) | set(GPU) <= set(attention_names())
    rows = {r["name"]: r for r in list_attention()}
    for name in CPU:
        assert rows[name]["available"] and rows[name]["device"] == "cpu" and rows[name]["logsumexp"]
    for name in GPU:
        assert rows[name]["device"] == "cuda" and rows[name]["engine_backend"]
        if not torch.cuda.is_available():
            assert not rows[name]["available"] and "CUDA" in rows[name]["reason"]
    assert rows["sdpa-flash-cpu"]["logsumexp"] == "returned by the backend"
    assert rows["sdpa-math"]["logsumexp"].startswith("computed alongside")


def test_unknown_name_says_did_you_mean_and_lists_the_valid_names() -> None:
    with pytest.raises(AttentionError) as info:
        get_attention("sdpa-flash")
    msg = str(info.value)
    assert "did you mean 'sdpa-flash-cpu'" in msg and "allowed: eager, fp64," in msg


def test_duplicate_and_bad_names_are_refused() -> None:
    with pytest.raises(AttentionError, match="already registered"):
        reg.register_attention(AttentionKernel(name="sdpa-math", device="cpu", description="", logsumexp="",
                                                compute=None))
    with pytest.raises(AttentionError, match="invalid attention kernel name"):
        reg.register_attention("tests:nothing", name="bad name")


def test_a_lazy_entry_that_cannot_load_is_a_row_with_its_error() -> None:
    reg.register_attention("tests.no_such_module:KERNEL", name="broken-attention")
    try:
        row = next(r for r in list_attention() if r["name"] == "broken-attention")
        assert row["available"] is False and "cannot load tests.no_such_module:KERNEL" in row["reason"]
    finally:
        reg._unregister("broken-attention")


@pytest.mark.parametrize("name", CPU)
@pytest.mark.parametrize("case", ["none", "causal", "float", "bool"])
def test_each_cpu_kernel_matches_a_float64_reference(name: str, case: str) -> None:
    q, k, v = _operands()
    mask: torch.Tensor | None = None
    if case == "float":
        mask = -0.25 * (torch.arange(9).reshape(-1, 1) - torch.arange(13).reshape(1, -1)).abs().float()
    elif case == "bool":
        mask = torch.ones((2, 1, 9, 13), dtype=torch.bool)
        mask[0, :, :, :3] = False
    out, lse = get_attention(name)(q, k, v, attn_mask=mask, is_causal=case == "causal", enable_gqa=True)
    ref, ref_lse = _f64(q, k, v, mask, case == "causal", 16**-0.5)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32 and lse.shape == (2, 4, 9)
    assert float((out.double() - ref).abs().max()) < 2e-6
    assert float((lse.double() - ref_lse).abs().max()) < 2e-5


def test_fp64_entry_is_the_engine_attention_bit_for_bit() -> None:
    from tasks.models.invariance import fp64_attention

    class Layer:
        num_key_value_groups = 2

    q, k, v = _operands()
    mask = torch.zeros((2, 1, 9, 13))
    mask[1, :, :, :4] = torch.finfo(torch.float32).min
    ours, _ = get_attention("fp64")(q, k, v, attn_mask=mask, scale=0.25, enable_gqa=True)
    engine, _ = fp64_attention(Layer(), q, k, v, mask, 0.25)
    assert torch.equal(ours.transpose(1, 2), engine)


def test_logsumexp_alongside_is_shared_and_flash_returns_its_own() -> None:
    q, k, v = _operands()
    lses = {n: get_attention(n)(q, k, v, is_causal=True, enable_gqa=True)[1] for n in ("sdpa-math", "eager")}
    k4 = k.repeat_interleave(2, dim=1)
    alongside = logsumexp_alongside(q, k4, None, True, 0.25)
    assert all(torch.equal(x, alongside) for x in lses.values())
    _, flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k4, v.repeat_interleave(2, dim=1), 0.0,
                                                                          True, scale=0.25)
    assert torch.equal(get_attention("sdpa-flash-cpu")(q, k, v, is_causal=True, enable_gqa=True)[1], flash)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_kernels_keep_the_input_dtype(dtype: torch.dtype) -> None:
    q, k, v = _operands(dtype)
    for name in CPU:
        out, lse = get_attention(name)(q, k, v, is_causal=True, enable_gqa=True)
        ref, _ = _f64(q, k, v, None, True, 0.25)
        assert out.dtype == dtype and lse.dtype == torch.float32
        assert float((out.double() - ref).abs().max()) < 0.05


@pytest.mark.parametrize(("kwargs", "match"), [
    ({}, "pass enable_gqa=True"),
    ({"enable_gqa": True, "is_causal": True, "attn_mask": torch.ones(9, 13, dtype=torch.bool)}, "not both"),
    ({"enable_gqa": True, "attn_mask": torch.ones(9, 13, dtype=torch.float64)}, "boolean or of the query's dtype"),
    ({"enable_gqa": True, "attn_mask": torch.ones(9, 12, dtype=torch.bool)}, "does not broadcast"),
    ({"enable_gqa": True, "scale": float("nan")}, "finite number"),
])
def test_bad_operands_are_clear_errors(kwargs: dict[str, Any], match: str) -> None:
    q, k, v = _operands()
    with pytest.raises(AttentionError, match=match):
        get_attention("sdpa-math")(q, k, v, **kwargs)


def test_gpu_entries_refuse_a_standalone_call() -> None:
    q, k, v = _operands(kv_heads=4)
    with pytest.raises(AttentionError, match="not available here"):
        get_attention("vllm-flash-attn")(q, k, v)


def test_kernels_attention_cli_lists_every_entry() -> None:
    res = runner.invoke(app, ["kernels", "attention", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert set(CPU) | set(GPU) <= set(rows)
    assert rows["vllm-flashinfer"]["vllm backend"] == "FLASHINFER" and rows["sdpa-math"]["available"] is True
    avail = runner.invoke(app, ["kernels", "attention", "--available", "--format", "json"])
    assert {r["name"] for r in json.loads(avail.stdout)} >= set(CPU)


# -- check attention --------------------------------------------------------------------------------


def _planted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
             scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A kernel that accumulates P V in bfloat16 (a rounding the plain fp32 algorithm does not allow)."""
    out, lse = get_attention("sdpa-math").compute(q, k, v, mask, causal, scale)  # type: ignore[misc]
    p = torch.softmax(q @ k.transpose(-1, -2) * scale + (torch.zeros(()) if mask is None else mask.float()), -1)
    if causal:
        p = torch.softmax((q @ k.transpose(-1, -2) * scale).masked_fill(
            ~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), float("-inf")), -1)
    acc = torch.zeros_like(out, dtype=torch.bfloat16)
    for j in range(k.shape[-2]):  # sequential accumulation, each partial sum rounded to bf16
        acc = (acc.float() + p[..., j: j + 1] * v[..., j: j + 1, :]).to(torch.bfloat16)
    return acc.to(q.dtype), lse


@pytest.fixture()
def planted() -> Any:
    kernel = AttentionKernel(name="planted-bf16-acc", device="cpu", compute=_planted, description="planted",
                             logsumexp="alongside")
    reg.register_attention(kernel)
    yield kernel
    reg._unregister("planted-bf16-acc")


def test_math_backend_passes_plain_in_fp32() -> None:
    res = run_attention_check("sdpa-math", "plain", "float32", trials=2)
    assert res.verdict.passed, res.text()
    assert res.positions == sum(r.positions for r in res.results) > 0 and res.mismatches == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_flash_kernel_passes_the_algorithm_that_describes_it(dtype: str) -> None:
    res = run_attention_check("sdpa-flash-cpu", "flash-cpu", dtype, trials=1, ulps=8)
    assert res.verdict.passed, res.text()


def test_planted_bf16_accumulation_fails_plain(planted: Any) -> None:
    res = run_attention_check("planted-bf16-acc", "plain", "float32", inputs=("randn",), trials=1)
    assert res.verdict.value == "INCORRECT" and res.mismatches > 0
    assert res.first_failure() is not None and res.first_failure().first is not None  # type: ignore[union-attr]


def test_check_attention_cli_exit_codes(planted: Any) -> None:
    ok = runner.invoke(app, ["check", "attention", "--kernel", "sdpa-math", "--algorithm", "plain", "--trials", "1",
                             "--inputs", "randn,causal", "--format", "json"])
    assert ok.exit_code == 0, ok.output
    obj = json.loads(ok.stdout)
    assert obj["check"] == "attention" and obj["passed"] is True and obj["settings"]["algorithm"] == "plain"
    bad = runner.invoke(app, ["check", "attention", "--kernel", "planted-bf16-acc", "--trials", "1", "--inputs", "randn"])
    assert bad.exit_code == 1 and "INCORRECT" in bad.stdout
    usage = runner.invoke(app, ["check", "attention", "--kernel", "sdpa-math", "--algorithm", "online=true"])
    assert usage.exit_code == 2 and "unknown key 'online'" in usage.output
    unknown = runner.invoke(app, ["check", "attention", "--kernel", "sdpa-mth"])
    assert unknown.exit_code == 2 and "did you mean 'sdpa-math'" in unknown.output


def test_algorithm_keyword_syntax_and_presets() -> None:
    label, alg = parse_algorithm("online_softmax=true,block_size=16,weights=bfloat16")
    assert label == "online_softmax=true,block_size=16,weights=bfloat16"
    assert repr(alg) == "AttentionAlgorithm(online_softmax=True, block_size=16, weights='bf16')"
    assert repr(parse_algorithm("flash")[1]) == repr(alg)
    assert "weights" not in repr(parse_algorithm("flash-cpu", "float32")[1])
    assert "weights='bf16'" in repr(parse_algorithm("flash-cpu", "bfloat16")[1])
    with pytest.raises(CheckInputError, match="not a preset"):
        parse_algorithm("fast")


def test_drawn_inputs_are_seeded_and_the_reference_is_float64() -> None:
    a = draw((1, 2, 5, 7, 4), "alibi", torch.float32, 3)
    b = draw((1, 2, 5, 7, 4), "alibi", torch.float32, 3)
    assert all(torch.equal(x, y) for x, y in zip(a[:4], b[:4], strict=True))  # type: ignore[arg-type]
    q, k, v, mask, causal = draw((2, 2, 5, 7, 4), "padded", torch.float32, 0)
    assert mask is not None and not bool(mask[0, 0, 0, 0]) and bool(mask[1].all()) and not causal
    out, lse = reference(q, k, v, mask, causal, 0.5)
    ref, ref_lse = _f64(q, k, v, mask, causal, 0.5)
    assert np.allclose(out.numpy(), ref.numpy(), rtol=0, atol=1e-15) and np.allclose(lse.numpy(), ref_lse.numpy())


@settings(max_examples=150, deadline=None)
@given(b=st.integers(1, 2), h=st.sampled_from([1, 2, 4]), length=st.integers(1, 24), s=st.integers(1, 48),
       d=st.sampled_from([4, 8, 16, 32]), kind=st.sampled_from(INPUT_KINDS), seed=st.integers(0, 2**31))
def test_cpu_kernels_stay_within_the_algorithms_that_describe_them(b: int, h: int, length: int, s: int, d: int,
                                                                    kind: str, seed: int) -> None:
    """Hypothesis-drawn shapes, masks and large logits: every fp32 output and logsumexp of each CPU
    kernel of the registry lies within the bounds of the algorithm it declares (``algorithm``:
    `plain`, or `flash-cpu` for the flash kernel)."""
    q, k, v, mask, causal = draw((b, h, length, s, d), kind, torch.float32, seed)
    for kernel in _callable_cpu_kernels():
        assert kernel.algorithm, f"{kernel.name}: a callable kernel names the algorithm that describes it"
        out, lse = kernel(q, k, v, attn_mask=mask, is_causal=causal)
        cover = parse_algorithm(kernel.algorithm)[1].covers(out, q, k, v, mask, causal, None, logsumexp=lse)
        assert cover.all(), (kernel.name, kernel.algorithm, int((~np.asarray(cover.out)).sum()),
                             int((~np.asarray(cover.logsumexp)).sum()))


def _callable_cpu_kernels() -> list[AttentionKernel]:
    """Every registered CPU kernel callable on its own (an engine backend is not)."""
    return [kern for kern in (get_attention(n) for n in attention_names())
            if kern.device == "cpu" and kern.compute is not None and kern.available()[0]]


def test_every_callable_cpu_kernel_is_held_to_its_algorithm() -> None:
    kernels = _callable_cpu_kernels()
    assert {k.name for k in kernels} >= set(CPU)
    assert all(k.algorithm for k in kernels), [k.name for k in kernels if not k.algorithm]
