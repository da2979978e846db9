"""triton-scaled-mm (tasks/kernels/triton_mm.py): swapcheck's Triton INT8/FP8 kernel after vLLM 0.32.

Fast (no triton needed): availability and its reasons, the tile heuristic, the operand boundary
(``scale_b`` ``[1, N]`` -> ``[N, 1]``, ``b`` column-major), parameters, the emulation pair and the declared
bound, and that importing ``tasks.kernels`` imports no triton.

Slow (need an importable triton; skipped with the reason otherwise: ``make triton``, or
``PYTHONPATH=<pip install --target DIR triton==3.6.0>``): under Triton's interpreter, INT8 bit for bit
equal to ``int8-triton-order`` on many small shapes (also past the int32 range), FP8 inside the bound
the kernel declares; and the PTX Triton writes for SM90 (compiled here, no GPU): the wgmma types, the
rounding conversion and the fused bias epilogue that ``fp_fusion`` controls.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from tasks.kernels import KernelError, get_kernel
from tasks.kernels.operands import check_operands
from tasks.kernels.triton_mm import (
    TritonScaledMM,
    next_power_of_2,
    tile_shape,
    triton_operands,
)
from tests.conftest import REPO

TRITON_FOUND = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(
    not TRITON_FOUND,
    reason="triton is not importable: `make triton` (requirements/triton.lock), or "
    "`pip install --target DIR triton==3.6.0` and PYTHONPATH=DIR",
)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# -- fast: no triton ------------------------------------------------------------------------------


def test_importing_the_kernels_imports_no_triton() -> None:
    """`swapcheck --help`, `kernels list` and provenance build every kernel and read its availability,
    code path and caveat: none of it imports triton (availability asks importlib.util.find_spec)."""
    code = (
        "import sys; from tasks.kernels import get_kernel\n"
        "for d in ('cuda', 'cpu'):\n"
        "    k = get_kernel('triton-scaled-mm', device=d); k.available(); k.code_path; k.caveat(); k.description\n"
        "assert 'triton' not in sys.modules, sorted(m for m in sys.modules if m.startswith('triton'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_availability_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import tasks.kernels.triton_mm as tm

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(tm, "cuda_reason", lambda: "CUDA not available (test)")
    monkeypatch.setattr(tm, "triton_reason", lambda: "triton not installed (test)")
    ok, why = get_kernel("triton-scaled-mm").available()
    assert not ok and why == "CUDA not available (test); triton not installed (test)"
    ok, why = get_kernel("triton-scaled-mm", device="cpu").available()
    assert not ok and why == "triton not installed (test)"  # the interpreter needs no CUDA

    monkeypatch.setattr(tm, "cuda_reason", lambda: None)
    monkeypatch.setattr(tm, "triton_reason", lambda: None)
    assert get_kernel("triton-scaled-mm").available() == (True, None)
    assert get_kernel("triton-scaled-mm", device="cpu").available() == (True, None)

    # TRITON_INTERPRET=1 in the process: compiling is refused, the interpreter is not affected
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ok, why = get_kernel("triton-scaled-mm").available()
    assert not ok and "TRITON_INTERPRET is set" in why and "device='cpu'" in why
    assert get_kernel("triton-scaled-mm", device="cpu").available() == (True, None)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert get_kernel("triton-scaled-mm").available() == (True, None)


def test_the_real_reasons_here() -> None:
    ok, why = get_kernel("triton-scaled-mm").available()
    if not TRITON_FOUND:
        assert not ok and "make triton" in why and "triton==3.6.0" in why
    if torch.version.cuda is None:
        assert not ok and "CUDA not available" in why


@pytest.mark.parametrize(
    "m,n,tile",
    [
        (1, 64, (64, 64, 256)), (32, 8191, (64, 64, 256)), (32, 8192, (64, 128, 256)),
        (1, 20000, (64, 128, 256)), (33, 8192, (64, 64, 256)), (64, 100000, (64, 64, 256)),
        (65, 16, (64, 128, 128)), (128, 16, (64, 128, 128)), (129, 16, (128, 128, 128)),
        (5000, 5000, (128, 128, 128)),
    ],
)  # fmt: skip
def test_tile_heuristic(m: int, n: int, tile: tuple[int, int, int]) -> None:
    """next_power_of_2(max(M, 32)): <=32 (64,64,256) or (64,128,256) at N >= 8192; <=64 (64,64,256);
    <=128 (64,128,128); else (128,128,128) (vllm-kernels.md §2.2)."""
    assert tile_shape(m, n) == tile


def test_next_power_of_2() -> None:
    assert [next_power_of_2(x) for x in (0, 1, 2, 3, 32, 33, 64, 65, 1000)] == [1, 1, 2, 4, 32, 64, 64, 128, 1024]


def _ops(m: int, k: int, n: int, per_tensor: bool = False, bias: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-128, 128, (k, m), dtype=torch.int8, generator=g).t()  # column-major a
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=g)  # row-major b
    sa = torch.tensor(0.5) if per_tensor else torch.rand(m, 1, generator=g) + 0.5
    sb = torch.tensor([0.25]) if per_tensor else torch.rand(1, n, generator=g) + 0.5
    bv = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
    kernel = TritonScaledMM(device="cpu")
    return check_operands(kernel, a, b, sa, sb, torch.bfloat16, bv)


def test_boundary_layouts_and_scale_b_transposed() -> None:
    ops = _ops(5, 19, 7, bias=True)
    o = triton_operands(ops)
    assert o["a"].is_contiguous() and torch.equal(o["a"], ops.a)
    assert o["b"].shape == (19, 7) and o["b"].stride(0) == 1 and torch.equal(o["b"], ops.b)  # column-major [K, N]
    assert o["scale_a"].shape == (5, 1) and o["scale_a"].is_contiguous()
    assert o["scale_b"].shape == (7, 1) and o["scale_b"].is_contiguous()  # [1, N] -> [N, 1]
    assert torch.equal(o["scale_b"].reshape(-1), ops.scale_b.reshape(-1))
    assert o["bias"] is not None and o["bias"].shape == (7,) and o["bias"].is_contiguous()

    per = triton_operands(_ops(5, 19, 7, per_tensor=True))
    assert per["scale_a"].shape == (1, 1) and per["scale_b"].shape == (1, 1)
    assert float(per["scale_a"]) == 0.5 and float(per["scale_b"]) == 0.25 and per["bias"] is None


def test_params_device_and_identity() -> None:
    k = get_kernel("triton-scaled-mm")
    assert k.params == {"device": "cuda", "fp_fusion": True} and k.device == "cuda" and k.operand_dtype == "any"
    c = get_kernel("triton-scaled-mm", device="cpu", fp_fusion=False)
    assert c.device == "cpu" and c.identity["params"] == {"device": "cpu", "fp_fusion": False}
    assert c != get_kernel("triton-scaled-mm", device="cpu")
    with pytest.raises(KernelError, match="device='gpu' is not allowed"):
        get_kernel("triton-scaled-mm", device="gpu")
    with pytest.raises(KernelError, match="fp_fusion must be true or false"):
        get_kernel("triton-scaled-mm", fp_fusion="yes")
    with pytest.raises(KernelError, match="runs on 'cuda'; operand a is on 'cpu'"):
        k(torch.zeros(2, 3, dtype=torch.int8), torch.zeros(3, 4, dtype=torch.int8),
          torch.ones(1), torch.ones(1), torch.bfloat16)  # fmt: skip
    assert "host rounds it to the output dtype with torch (round to nearest even)" in c.code_path
    assert "fma" in k.code_path and "mul.rn.f32 then add.rn.f32" in get_kernel("triton-scaled-mm", fp_fusion=False).code_path


def test_emulation_pair_prediction_and_declared_bounds() -> None:
    cuda, cpu = get_kernel("triton-scaled-mm"), get_kernel("triton-scaled-mm", device="cpu")
    for k in (cuda, cpu):
        assert k.emulation() == {"kernel": "int8-triton-order", "params": {"bias_mode": "fp32"}}
        assert k.emulation("fp8_e4m3") == {"kernel": "fp8-blocked", "params": {"block_size": 32, "epilogue": "triton"}}
        e = k.emulation("fp8_e4m3")
        get_kernel(e["kernel"], **e["params"])  # a real kernel with real params
        assert k.prediction("fp8_e4m3") == "bound"
        assert k.prediction("int8") == "bit_for_bit"
        assert k.bounds_algorithm("int8", 8, 8) == ("exact", "fp32")
    assert cuda.prediction("int8", has_bias=True) == "bound"  # fused bias epilogue (fp_fusion)
    assert cpu.prediction("int8", has_bias=True) == "bit_for_bit"  # the interpreter never fuses
    assert get_kernel("triton-scaled-mm", fp_fusion=False).prediction("int8", has_bias=True) == "bit_for_bit"
    assert cpu.bounds_algorithm("fp8_e4m3", 70, 33) == ("blocked-128", "fp32")
    assert cpu.bounds_algorithm("fp8_e4m3", 20, 33) == ("blocked-256", "fp32")
    assert cuda.bounds_algorithm("fp8_e4m3", 20, 33, capability=(9, 0)) == ("any", "bf16")
    assert cuda.bounds_algorithm("fp8_e4m3", 20, 33, capability=(10, 0)) == ("any", "fp32")
    from tasks.checks.bounds import algorithm

    for args in (("exact", "fp32"), ("blocked-128", "fp32"), ("any", "bf16")):
        algorithm(*args)  # every declared name is one the bounds check knows


# -- slow: under Triton's interpreter ---------------------------------------------------------------

# (M, K, N): M over 1..70 (every tile-heuristic branch up to (64, 128, 128)), K and N not multiples of 16
INT8_SHAPES = [(1, 7, 5), (2, 33, 3), (5, 300, 45), (13, 1, 9), (17, 129, 31), (31, 257, 19),
               (32, 515, 47), (33, 100, 70), (47, 77, 129), (64, 513, 3), (65, 131, 33), (70, 1001, 17)]  # fmt: skip


def _int8_case(m: int, k: int, n: int, seed: int, bias: bool, out_dtype: torch.dtype, per_tensor: bool):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g).t()  # the w.t() view vLLM passes
    if per_tensor:
        sa, sb = torch.rand(1, generator=g) * 1e-2, torch.rand(1, generator=g) * 1e-2
    else:
        sa, sb = torch.rand(m, 1, generator=g) * 1e-2, torch.rand(1, n, generator=g) * 1e-2  # real scales
    bv = (torch.randn(n, generator=g) * 8).to(out_dtype) if bias else None
    return a, b, sa, sb, out_dtype, bv


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["bf16", "fp16", "fp32"])
def test_interpreter_int8_bit_for_bit_with_int8_triton_order(out_dtype: torch.dtype) -> None:
    from tasks.kernels import epilogue

    kernel = get_kernel("triton-scaled-mm", device="cpu")
    e = kernel.emulation("int8")
    emulation = get_kernel(e["kernel"], **e["params"])
    bits = torch.int32 if out_dtype == torch.float32 else torch.int16
    checked = 0
    for i, (m, k, n) in enumerate(INT8_SHAPES):
        for bias in (False, True):
            case = _int8_case(m, k, n, seed=i, bias=bias, out_dtype=out_dtype, per_tensor=i % 4 == 3)
            got, want = kernel(*case), emulation(*case)
            if k == 1:
                # torch._int_mm on the CPU (torch 2.13, oneDNN) returns unset memory at K = 1, so the
                # emulation's accumulator is wrong there on a machine where it takes that path; the
                # Triton epilogue on the exact integers is the same formula without it.
                a, b, sa, sb, _, bv = case
                acc = (a.long() @ b.long()).to(torch.float32)
                want = epilogue.triton(acc, sa.reshape(-1, 1).expand(m, 1), sb.reshape(1, -1).expand(1, n),
                                       out_dtype, bv, e["params"]["bias_mode"])  # fmt: skip
            assert got.dtype == out_dtype and got.shape == (m, n)
            assert torch.equal(got.view(bits), want.view(bits)), (m, k, n, bias)  # every bit
            checked += got.numel()
    assert checked > 20_000


@pytest.mark.slow
@needs_triton
def test_interpreter_int8_wraps_past_the_int32_range_like_the_emulation() -> None:
    """K = 140000 of (-128)(-128): 2 293 760 000 wraps to -2 001 207 296 in int32, as on a GPU."""
    k = 140_000
    a = torch.full((2, k), -128, dtype=torch.int8)
    b = torch.full((k, 3), -128, dtype=torch.int8)
    one = torch.ones(1)
    got = get_kernel("triton-scaled-mm", device="cpu")(a, b, one, one, torch.float32)
    want = get_kernel("int8-triton-order")(a, b, one, one, torch.float32)
    assert torch.equal(got, want) and float(got[0, 0]) == -2_001_207_296.0


@pytest.mark.slow
@needs_triton
def test_interpreter_output_is_the_fp32_result_rounded_by_torch() -> None:
    """The interpreter's own fp32 -> bf16 truncates (reference §6): the kernel stores fp32 and the host
    rounds, so a bf16 output is the fp32 output rounded to nearest even (and truncation would differ)."""
    kernel = get_kernel("triton-scaled-mm", device="cpu")
    case = list(_int8_case(40, 300, 50, seed=7, bias=True, out_dtype=torch.bfloat16, per_tensor=False))
    bf = kernel(*case)
    assert case[5] is not None
    case[4], case[5] = torch.float32, case[5].float()
    f32 = kernel(*case)
    assert torch.equal(bf, f32.to(torch.bfloat16))
    truncated = (f32.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    assert bool((truncated != bf).any())


@pytest.mark.slow
@needs_triton
def test_interpreter_fp8_products_are_exact() -> None:
    """The interpreter's fp8 tl.dot upcasts e4m3 to fp16 first: every finite e4m3 value (254) times every
    other, at K = 1 with unit scales, is its exact product (fp32 holds every e4m3 x e4m3 product)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = codes[(codes & 0x7F) != 0x7F].view(torch.float8_e4m3fn)
    a, b = values.reshape(-1, 1).contiguous(), values.reshape(1, -1).contiguous()
    one = torch.ones(1)
    got = get_kernel("triton-scaled-mm", device="cpu")(a, b, one, one, torch.float32)
    assert got.shape == (254, 254)
    assert torch.equal(got, values.float()[:, None] * values.float()[None, :])


def _fp8_subject(device: str = "cpu"):
    from tasks.checks import load_subject

    return load_subject("triton-scaled-mm", {"device": device}, operands="fp8_e4m3")


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("shape", [(33, 700, 17), (70, 300, 45)], ids=["blocked-256", "blocked-128"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_interpreter_fp8_within_its_declared_bound(shape: tuple[int, int, int], out_dtype: torch.dtype) -> None:
    """FP8 under the interpreter is numpy's summation (not a GPU prediction): every output inside the
    ``blocked-<BLOCK_K>`` fp32 bound it declares, on randn, uniform-positive and mixed-scale draws."""
    from tasks.checks import run_bounds
    from tasks.checks.bounds import algorithm

    m, k, n = shape
    kernel = get_kernel("triton-scaled-mm", device="cpu")
    name, accumulate = kernel.bounds_algorithm("fp8_e4m3", m, n)
    assert name == f"blocked-{tile_shape(m, n)[2]}"
    algorithm(name, accumulate)
    res = run_bounds(_fp8_subject(), [shape], name, out_dtype, trials=6, accumulate=accumulate)
    assert res.passed, res.text()


@pytest.mark.slow
@needs_triton
def test_interpreter_fp8_with_bias_and_real_scales_runs_the_triton_epilogue() -> None:
    """With real scales and a bias the fp8 result is the Triton epilogue applied to the interpreter's
    accumulator: the kernel's fp32 output equals that epilogue on its unit-scale fp32 accumulator."""
    from tasks.kernels import epilogue

    g = torch.Generator().manual_seed(3)
    m, k, n = 21, 333, 29
    a = (torch.randn(m, k, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, generator=g) * 4).to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(m, 1, generator=g) * 0.1, torch.rand(1, n, generator=g) * 0.1
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    kernel = get_kernel("triton-scaled-mm", device="cpu")
    acc = kernel(a, b, torch.ones(1), torch.ones(1), torch.float32)  # fl(1*fl(1*acc)) = acc
    got = kernel(a, b, sa, sb, torch.bfloat16, bias)
    assert torch.equal(got, epilogue.triton(acc, sa, sb, torch.bfloat16, bias, "fp32"))


@pytest.mark.slow
@needs_triton
def test_one_process_runs_the_interpreter_whatever_triton_interpret_says(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = get_kernel("triton-scaled-mm", device="cpu")
    case = _int8_case(9, 50, 11, seed=1, bias=False, out_dtype=torch.bfloat16, per_tensor=False)
    want = get_kernel("int8-triton-order")(*case)
    for value in ("1", "0"):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert torch.equal(kernel(*case), want)


# -- slow: the PTX Triton writes for SM90 (compiled on this CPU, no GPU) --------------------------------


def _ptx(dtype: str, bias: bool, fp_fusion: bool) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tasks.kernels import _triton_jit as jit

    fn = jit.kernel_for("cuda")
    signature = {name: "i32" for name in fn.arg_names}
    signature.update(a_ptr=f"*{dtype}", b_ptr=f"*{dtype}", c_ptr="*bf16", sa_ptr="*fp32", sb_ptr="*fp32",
                     bias_ptr="*bf16")  # fmt: skip
    consts = {"ACC_INT32": dtype == "i8", "SA_STEP": 1, "SB_STEP": 1, "HAS_BIAS": bias, "BLOCK_M": 64,
              "BLOCK_N": 64, "BLOCK_K": 256, "INTERPRETED": False, "K_TILES": 0}  # fmt: skip
    signature.update({name: "constexpr" for name in consts})
    src = ASTSource(fn=fn, signature=signature, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 128), options={"enable_fp_fusion": fp_fusion})
    ptx: str = compiled.asm["ptx"]
    return ptx


@pytest.mark.slow
@needs_triton
def test_sm90_ptx_wgmma_types_rounding_and_the_fused_bias(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """What the GPU will run, read from Triton 3.6's own output for SM90: int8 wgmma into s32, fp8 e4m3
    wgmma into f32 with no promoting fp32 adds (imprecise accumulation), int32 -> fp32 and fp32 -> bf16
    with round to nearest even (cvt.rn), and the bias epilogue fused into one fma.rn.f32 by default."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    int8_fused = _ptx("i8", bias=True, fp_fusion=True)
    assert "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8" in int8_fused
    assert "cvt.rn.f32.s32" in int8_fused and "cvt.rn.bf16x2.f32" in int8_fused
    assert "fma.rn.f32" in int8_fused
    int8_unfused = _ptx("i8", bias=True, fp_fusion=False)
    assert "fma.rn.f32" not in int8_unfused and "mul.rn.f32" in int8_unfused and "add.rn.f32" in int8_unfused
    fp8_nobias = _ptx("fp8e4nv", bias=False, fp_fusion=True)
    assert "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3" in fp8_nobias
    assert "fma.rn.f32" not in fp8_nobias and "add.f32" not in fp8_nobias and "add.rn.f32" not in fp8_nobias
    assert os.environ.get("TRITON_INTERPRET") is None
