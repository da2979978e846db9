"""The GPU lease kit's cuBLAS kernels (tasks/kernels/cublas.py) and torch-scaled-mm-cuda's ``device``,
on the CPU: each ``device="cpu"`` path bit for bit against its emulation or an independent oracle,
the ``torch._int_mm`` padding path run on the CPU, the declared bound of ``cublas-matmul``, and the
``device="cuda"`` kernels refused on a machine without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _kernel_oracle import (
    bias_tensor,
    exact_oracle,
    fp8_matrix,
    int8_oracle,
    out_dtypes,
    same_bits,
    scale_tensors,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.kernels import KernelError, get_kernel, list_kernels
from tasks.kernels.accumulator import int32_accumulator
from tasks.kernels.cublas import (
    EMULATIONS,
    INT8_EPILOGUES,
    INT_MM_MIN_M,
    int_mm_shape,
    matmul_settings,
    pad_for_int_mm,
    padded_int_mm,
)

NO_CUDA = not torch.cuda.is_available()


def _int8(gen: torch.Generator, rows: int, cols: int, extreme: bool) -> torch.Tensor:
    t = torch.randint(-128, 128, (rows, cols), dtype=torch.int8, generator=gen)
    if extreme:  # all-extreme first row / column: the largest sums, -128 * -128 products
        t[0] = -128
        t[:, 0] = 127
    return t


@st.composite
def int8_problem(draw, max_m: int = 40, max_k: int = 70, max_n: int = 20):
    """M in 1..40 (both sides of torch._int_mm's M > 16), K and N mostly not multiples of 8."""
    m, k, n = draw(st.integers(1, max_m)), draw(st.integers(1, max_k)), draw(st.integers(1, max_n))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    extreme = draw(st.booleans())
    a, b = _int8(gen, m, k, extreme), _int8(gen, k, n, extreme)
    sa, sb = draw(scale_tensors(m, n))
    out = draw(out_dtypes)
    bias = draw(bias_tensor(n, out, scale=draw(st.sampled_from([2.0**-10, 1.0, 2.0**10]))))
    return a, b, sa, sb, out, bias


# -- cublas-int8 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("ep", INT8_EPILOGUES)
@settings(max_examples=60, deadline=None)
@given(problem=int8_problem())
def test_cublas_int8_cpu_equals_its_emulation(ep, problem):
    a, b, sa, sb, out, bias = problem
    kernel = get_kernel("cublas-int8", device="cpu", epilogue=ep)
    emu = kernel.emulation()
    want = get_kernel(emu["kernel"], **emu["params"])(a, b, sa, sb, out, bias)
    got = kernel(a, b, sa, sb, out, bias)
    assert same_bits(got, want), (ep, got, want)


@pytest.mark.parametrize("ep", INT8_EPILOGUES)
def test_cublas_int8_cpu_equals_the_fraction_oracle(ep):
    # Independent of the emulation kernels: every fp32 operation rounded from the exact Fraction.
    gen = torch.Generator().manual_seed(38)
    kind = {"channelwise": "channelwise", "cutlass": "cutlass", "triton": "triton-fp32"}[ep]
    kernel = get_kernel("cublas-int8", device="cpu", epilogue=ep)
    for m, k, n in [(1, 1, 1), (16, 9, 3), (17, 8, 8), (23, 13, 5)]:
        a, b = _int8(gen, m, k, True), _int8(gen, k, n, False)
        sa, sb = torch.rand(m, 1, generator=gen) * 2, torch.rand(1, n, generator=gen) * 2
        for out in (torch.bfloat16, torch.float16, torch.float32):
            for bias in (None, torch.randn(n, generator=gen).to(out)):
                assert same_bits(kernel(a, b, sa, sb, out, bias), int8_oracle(a, b, sa, sb, out, bias, kind))


def test_cublas_int8_params_emulations_and_identity():
    k = get_kernel("cublas-int8")
    assert k.params == {"device": "cuda", "epilogue": "channelwise"} and k.device == "cuda"
    assert k.operand_dtype == "int8"
    assert {ep: get_kernel("cublas-int8", epilogue=ep).emulation() for ep in INT8_EPILOGUES} == {
        "channelwise": {"kernel": "int8-torch-channelwise", "params": {}},
        "cutlass": {"kernel": "int8-cutlass-order", "params": {}},
        "triton": {"kernel": "int8-triton-order", "params": {"bias_mode": "fp32"}},
    } == EMULATIONS
    cut = get_kernel("cublas-int8", epilogue="cutlass")
    assert "torch.addcmul" in cut.description and "predicted" in cut.description and "not known" in cut.description
    cpu = get_kernel("cublas-int8", device="cpu", epilogue="cutlass")
    assert cpu.device == "cpu" and cpu.available() == (True, None)
    assert cpu.code_path.startswith("CPU exact int32: int8 accumulator ") and "fma32" in cpu.description
    assert get_kernel("cublas-int8").code_path.startswith("cuBLAS torch._int_mm on ")
    with pytest.raises(KernelError, match="epilogue='fast' is not allowed"):
        get_kernel("cublas-int8", epilogue="fast")
    with pytest.raises(KernelError, match="device='gpu' is not allowed"):
        get_kernel("cublas-int8", device="gpu")


def test_cublas_int8_cutlass_bias_is_one_fused_rounding_on_the_cpu():
    # fl(sa*t) + bias loses the low bits that the FMA keeps (as test_kernels_int8 shows for the emulation).
    a, b = torch.tensor([[1]], dtype=torch.int8), torch.tensor([[3]], dtype=torch.int8)
    sa, sb = torch.tensor([1.0 + 2**-23]), torch.tensor([1.0])
    bias = torch.tensor([-3.0])
    got = get_kernel("cublas-int8", device="cpu", epilogue="cutlass")(a, b, sa, sb, torch.float32, bias)
    assert got.item() == 3 * 2**-23
    unfused = get_kernel("cublas-int8", device="cpu")(a, b, sa, sb, torch.float32, bias)
    assert unfused.item() != got.item()


# -- the torch._int_mm padding path, run on the CPU -----------------------------------------------


def _strict_int_mm(calls: list[tuple[int, int, int]]):
    """An exact int32 GEMM that refuses what torch._int_mm on CUDA refuses (M <= 16, K or N not a
    multiple of 8), and records the shapes it was given."""

    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        m, k, n = int(a.shape[0]), int(a.shape[1]), int(b.shape[1])
        if m <= 16 or k % 8 or n % 8:
            raise RuntimeError(f"torch._int_mm on CUDA refuses {m}x{k}x{n}")
        assert a.dtype == b.dtype == torch.int8 and a.is_contiguous() and b.is_contiguous()
        calls.append((m, k, n))
        return int32_accumulator(a, b)

    return mm


@settings(max_examples=150, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 70), n=st.integers(1, 40), seed=st.integers(0, 2**31 - 1),
       extreme=st.booleans())
def test_padded_int_mm_is_exact_for_every_shape(m, k, n, seed, extreme):
    gen = torch.Generator().manual_seed(seed)
    a, b = _int8(gen, m, k, extreme), _int8(gen, k, n, extreme)
    calls: list[tuple[int, int, int]] = []
    got = padded_int_mm(a, b, _strict_int_mm(calls))
    want = a.numpy().astype(np.int64) @ b.numpy().astype(np.int64)
    assert got.dtype == torch.int32 and tuple(got.shape) == (m, n)
    assert np.array_equal(got.numpy().astype(np.int64), want)
    mp, kp, np_ = int_mm_shape(m, k, n)
    assert calls == [(mp, kp, np_)]
    assert mp == max(m, INT_MM_MIN_M) and kp - k in range(8) and np_ - n in range(8)


def test_pad_for_int_mm_copies_nothing_when_the_shape_is_allowed():
    a = torch.ones(17, 16, dtype=torch.int8)
    b = torch.ones(16, 8, dtype=torch.int8)
    ap, bp = pad_for_int_mm(a, b)
    assert ap.data_ptr() == a.data_ptr() and bp.data_ptr() == b.data_ptr()
    ap, bp = pad_for_int_mm(a[:3, :5], b[:5, :3])
    assert tuple(ap.shape) == (17, 8) and tuple(bp.shape) == (8, 8)
    assert int(ap[3:].abs().sum()) == 0 and int(ap[:, 5:].abs().sum()) == 0 and int(bp[5:].abs().sum()) == 0
    with pytest.raises(RuntimeError, match="refuses 3x5x3"):  # the stand-in refuses what CUDA refuses
        _strict_int_mm([])(a[:3, :5], b[:5, :3])


# -- cublas-matmul ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_cublas_matmul_equals_an_independent_reference_where_the_product_is_exact(dtype):
    # int8 values in [-7, 7] and K <= 5: |acc| <= 245, exact in bf16 (and fp16, fp32), so C is the exact
    # integer and the kernel is the channel-wise epilogue on the exact accumulator (the Fraction oracle).
    # For fp32 also every K <= 1024 with full-range values: |acc| <= 2**24.
    gen = torch.Generator().manual_seed(7)
    kernel = get_kernel("cublas-matmul", device="cpu", dtype=dtype)
    cases = [(m, k, n, 7) for m, k, n in [(1, 1, 1), (5, 3, 7), (17, 5, 9), (33, 4, 2)]]
    if dtype == "fp32":
        cases += [(9, 1024, 3, 127), (3, 77, 11, 127)]
    for m, k, n, top in cases:
        a = torch.randint(-top, top + 1, (m, k), dtype=torch.int8, generator=gen)
        b = torch.randint(-top, top + 1, (k, n), dtype=torch.int8, generator=gen)
        sa, sb = torch.rand(m, generator=gen), torch.rand(n, generator=gen) * 3
        for out in (torch.bfloat16, torch.float16, torch.float32):
            for bias in (None, torch.randn(n, generator=gen).to(out)):
                got = kernel(a, b, sa, sb, out, bias)
                assert same_bits(got, int8_oracle(a, b, sa, sb, out, bias, "channelwise")), (m, k, n, out)


def test_cublas_matmul_fp32_unit_scales_equal_the_exact_result():
    # Unit scales, no bias, fp32 output: the correctly rounded exact product (tests/_kernel_oracle).
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(-128, 128, (19, 300), dtype=torch.int8, generator=gen)
    b = torch.randint(-128, 128, (300, 13), dtype=torch.int8, generator=gen)
    one = torch.tensor(1.0)
    got = get_kernel("cublas-matmul", device="cpu", dtype="fp32")(a, b, one, one, torch.float32)
    assert same_bits(got, exact_oracle(a, b, one, one, torch.float32, None))


@st.composite
def matmul_problem(draw):
    m, k, n = draw(st.integers(1, 40)), draw(st.integers(1, 300)), draw(st.integers(1, 20))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if draw(st.booleans()):
        a, b = _int8(gen, m, k, draw(st.booleans())), _int8(gen, k, n, False)
    else:
        a, b = draw(fp8_matrix(m, min(k, 40))), draw(fp8_matrix(min(k, 40), n))
    sa, sb = draw(scale_tensors(m, n))
    out = draw(out_dtypes)
    bias = draw(bias_tensor(n, out))
    return a, b, sa, sb, out, bias


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@settings(max_examples=40, deadline=None)
@given(problem=matmul_problem())
def test_cublas_matmul_declared_bound_holds(dtype, problem):
    a, b, sa, sb, out, bias = problem
    kernel = get_kernel("cublas-matmul", device="cpu", dtype=dtype)
    got = kernel(a, b, sa, sb, out, bias)
    low, high = kernel.output_bound(a, b, sa, sb, out, bias)
    assert low.dtype == high.dtype == out and bool((low <= high).all())
    inside = kernel.covers(got, a, b, sa, sb, bias)
    assert bool(inside.all()), (got[~inside], low[~inside], high[~inside])


def test_cublas_matmul_bound_has_the_double_rounding_and_the_single_rounding_model_misses_it():
    # acc = 127 + 127 + 3 = 257; torch.matmul in bf16 returns 256 (a tie, to even); fp32 output 256.0.
    # The fp32 'any' bound rounded once to fp32 allows only 257: the declaration must carry the bf16 step.
    from tasks.numerics.products import matmul_sequential

    a = torch.tensor([[127, 127, 3]], dtype=torch.int8)
    b = torch.ones(3, 1, dtype=torch.int8)
    one = torch.tensor(1.0)
    kernel = get_kernel("cublas-matmul", device="cpu", dtype="bf16")
    got = kernel(a, b, one, one, torch.float32)
    assert got.item() == 256.0
    low, high = matmul_sequential("fp32", fma=False).finite_range(a.float(), b.float())
    assert not (low[0, 0] <= 256.0 <= high[0, 0])  # the single-rounding model refuses the real output
    assert bool(kernel.covers(got, a, b, one, one).all())
    decl = kernel.declaration()
    assert decl["algorithm"] == "any" and decl["accumulate"] == "fp32" and decl["rounded_to"] == "bf16"
    assert decl["single_rounding_out_dtypes"] == ["bf16"]
    assert get_kernel("cublas-matmul", dtype="fp32").declaration()["rounded_to"] is None


def test_cublas_matmul_fp16_overflow_is_inside_the_bound():
    # 8 products of 127 * 127 = 129032 > 65504: C is inf in fp16, and the bound says it may be.
    a = torch.full((1, 8), 127, dtype=torch.int8)
    b = torch.full((8, 1), 127, dtype=torch.int8)
    s = torch.tensor(2.0**-4)
    kernel = get_kernel("cublas-matmul", device="cpu", dtype="fp16")
    got = kernel(a, b, s, s, torch.float32)
    assert got.item() == float("inf") and bool(kernel.covers(got, a, b, s, s).all())
    # bf16 has fp32's range: C = bf16(129032) = 129024 (spacing 512 there), scaled by 2**-8
    assert get_kernel("cublas-matmul", device="cpu", dtype="bf16")(a, b, s, s, torch.float32).item() == 129024 / 256


def test_cublas_matmul_params():
    k = get_kernel("cublas-matmul")
    assert k.params == {"device": "cuda", "dtype": "bf16"} and k.device == "cuda" and k.operand_dtype == "any"
    fp32 = get_kernel("cublas-matmul", dtype="fp32")
    assert "allow_tf32=False" in fp32.description and "unknown order" in fp32.description
    assert "double rounding" in k.description and "double rounding" not in fp32.description
    with pytest.raises(KernelError, match="dtype='tf32' is not allowed"):
        get_kernel("cublas-matmul", dtype="tf32")


def test_matmul_settings_set_and_restore_the_flags():
    cm = torch.backends.cuda.matmul
    before = (cm.allow_tf32, cm.allow_bf16_reduced_precision_reduction, cm.allow_fp16_reduced_precision_reduction)
    try:
        cm.allow_tf32 = True
        cm.allow_bf16_reduced_precision_reduction = True
        with pytest.raises(ValueError, match="inside"), matmul_settings("cuda", torch.float32) as applied:
            assert cm.allow_tf32 is False and cm.allow_bf16_reduced_precision_reduction is False
            assert cm.allow_fp16_reduced_precision_reduction is False
            assert applied["torch.backends.cuda.matmul.allow_tf32"] is False
            raise ValueError("inside")
        assert cm.allow_tf32 is True and cm.allow_bf16_reduced_precision_reduction is True
    finally:
        cm.allow_tf32, cm.allow_bf16_reduced_precision_reduction, cm.allow_fp16_reduced_precision_reduction = before


def test_matmul_settings_restore_the_cpu_fp16_flag(monkeypatch):
    # Setting the CPU's fp16 flag True fails on a CPU without fp16 arithmetic: a stand-in records it.
    state = {"value": True}
    monkeypatch.setattr(torch._C, "_get_cpu_allow_fp16_reduced_precision_reduction", lambda: state["value"],
                        raising=False)
    monkeypatch.setattr(torch._C, "_set_cpu_allow_fp16_reduced_precision_reduction",
                        lambda v: state.update(value=v), raising=False)
    with matmul_settings("cpu", torch.float16) as applied:
        assert state["value"] is False and list(applied) == ["torch._C cpu allow_fp16_reduced_precision_reduction"]
    assert state["value"] is True
    with matmul_settings("cpu", torch.bfloat16) as applied:
        assert state["value"] is True and applied == {}


# -- torch-scaled-mm-cuda on the CPU ---------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 24), k=st.sampled_from([16, 32, 48]), n=st.sampled_from([16, 32]), data=st.data())
def test_torch_scaled_mm_cuda_on_cpu_equals_fp8_torch_scaled_mm(m, k, n, data):
    a, b = data.draw(fp8_matrix(m, k)), data.draw(fp8_matrix(k, n))
    per_tensor = data.draw(st.booleans())
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    sa = torch.tensor(0.5) if per_tensor else torch.rand(m, 1, generator=gen)
    sb = torch.tensor(0.25) if per_tensor else torch.rand(1, n, generator=gen)
    out = data.draw(out_dtypes) if per_tensor else torch.bfloat16
    bias = data.draw(bias_tensor(n, out))
    kernel = get_kernel("torch-scaled-mm-cuda", device="cpu", use_fast_accum=data.draw(st.booleans()))
    assert same_bits(kernel(a, b, sa, sb, out, bias), get_kernel("fp8-torch-scaled-mm")(a, b, sa, sb, out, bias))


def test_torch_scaled_mm_cuda_device_param():
    cpu = get_kernel("torch-scaled-mm-cuda", device="cpu")
    assert cpu.device == "cpu" and cpu.available() == (True, None)
    assert cpu.params == {"use_fast_accum": False, "device": "cpu"} and "CPU" in cpu.description
    assert cpu.code_path and cpu.provenance()["device"] == "cpu"
    ok, reason = cpu.supports(8, 32, 40, 1, 1, False)  # cuBLASLt's rule kept on the CPU
    assert not ok and "K=40" in reason
    a, b = torch.zeros(4, 32, dtype=torch.float8_e4m3fn), torch.zeros(32, 16, dtype=torch.float8_e4m3fn)
    with pytest.raises(KernelError, match="row-wise scales .* need out_dtype torch.bfloat16"):
        cpu(a, b, torch.rand(4), torch.rand(16), torch.float16)  # cuBLASLt's rule, kept on the CPU
    gpu = get_kernel("torch-scaled-mm-cuda")
    assert gpu.device == "cuda" and gpu.code_path is None
    with pytest.raises(KernelError, match="device='tpu' is not allowed"):
        get_kernel("torch-scaled-mm-cuda", device="tpu")


def test_device_param_enters_unit_ids_only_where_a_spec_sets_it():
    from tasks.kinds.fields import Implementation, impl_payload

    plain = impl_payload(Implementation(kernel="torch-scaled-mm-cuda", params={"use_fast_accum": True}))
    assert plain == {"name": "torch-scaled-mm-cuda", "kernel": "torch-scaled-mm-cuda",
                     "params": {"use_fast_accum": True}, "version": "1"}
    cpu = impl_payload(Implementation(kernel="torch-scaled-mm-cuda", params={"device": "cpu"}))
    assert cpu["params"] == {"device": "cpu"}


# -- device="cuda" without a GPU -------------------------------------------------------------------


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is visible")
@pytest.mark.parametrize(("name", "params"), [("cublas-int8", {}), ("cublas-matmul", {"dtype": "fp32"}),
                                              ("torch-scaled-mm-cuda", {})])
def test_cuda_kernels_are_unavailable_here_with_a_reason(name, params):
    k = get_kernel(name, **params)
    ok, reason = k.available()
    assert not ok and reason.startswith("CUDA not available")
    rows = {r["name"]: r for r in list_kernels()}
    assert rows[name]["available"] is False and rows[name]["reason"].startswith("CUDA not available")
    assert rows[name]["device"] == "cuda"
    from tasks.checks.subject import CheckInputError, load_subject

    with pytest.raises(CheckInputError, match="is not available here: CUDA not available"):
        load_subject(name, params).preflight(17, 16, 16)  # what `swapcheck check` does first


def test_kernels_list_cli_shows_the_cublas_kernels():
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    res = CliRunner().invoke(app, ["kernels", "list", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)}
    assert rows["cublas-int8"]["operands"] == "int8" and rows["cublas-matmul"]["operands"] == "any"
    for name in ("cublas-int8", "cublas-matmul"):
        assert rows[name]["device"] == "cuda"
        assert rows[name]["available"] is (not NO_CUDA)


SPEC = """
name = "cublas-refusal"
question = "Do the cuBLAS kernels match their emulations?"

[experiments.int8]
kind = "kdepth"
dtype = "int8"
implementations = [{{ kernel = "cublas-int8", params = {{ epilogue = "cutlass"{device} }} }}, "int8-cutlass-order"]
reference = "exact"
scale_modes = ["real"]
m = 17
n = 8
k = [8]
seeds = 1
out_dtype = "bf16"
"""


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is visible")
def test_a_spec_naming_a_cuda_cublas_kernel_is_refused_here_and_its_cpu_mode_is_not(tmp_path: Path):
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    runner = CliRunner()
    spec = tmp_path / "cublas.toml"
    spec.write_text(SPEC.format(device=""))
    plan = runner.invoke(app, ["sweep", "plan", str(spec), "--format", "json"])
    assert plan.exit_code == 0, plan.output
    assert all("gpu=1" in r["resources"] for r in json.loads(plan.stdout))
    results = tmp_path / "results"
    res = runner.invoke(app, ["sweep", "launch", str(spec), "--results", str(results), "--no-progress"])
    assert res.exit_code == 2 and "request a GPU" in res.output and "no GPU" in res.output
    assert not results.exists()
    spec.write_text(SPEC.format(device=', device = "cpu"'))
    plan = runner.invoke(app, ["sweep", "plan", str(spec), "--format", "json"])
    assert plan.exit_code == 0, plan.output
    assert all("gpu=0" in r["resources"] for r in json.loads(plan.stdout))


def test_matmul_settings_fall_back_to_the_new_tf32_api(monkeypatch):
    # After a mix of the legacy and new TF32 APIs torch refuses to read allow_tf32: the new one is set.
    import tasks.kernels.cublas as cublas

    real_get = cublas._get
    monkeypatch.setattr(cublas, "_get", lambda obj, name: None if name == "allow_tf32" else real_get(obj, name))
    cm = torch.backends.cuda.matmul
    before = cm.fp32_precision
    with matmul_settings("cuda", torch.float32) as applied:
        assert cm.fp32_precision == "ieee" and applied["torch.backends.cuda.matmul.fp32_precision"] == "ieee"
        assert "torch.backends.cuda.matmul.allow_tf32" not in applied
    assert cm.fp32_precision == before


def test_int32_accumulator_is_exact_at_k_1_with_a_column_major_b() -> None:
    """torch 2.13's CPU _int_mm returns unset memory at K = 1 for a column-major b (found by the Triton
    kernel's tests); every INT8 emulation reads the accumulator, so K = 1 takes the exact integers."""
    import torch

    from tasks.kernels.accumulator import int32_accumulator

    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        a = torch.randint(-128, 128, (40, 1), dtype=torch.int8, generator=g)
        b = torch.randint(-128, 128, (48, 1), dtype=torch.int8, generator=g).t()
        assert torch.equal(int32_accumulator(a, b), a.to(torch.int32) @ b.to(torch.int32))
