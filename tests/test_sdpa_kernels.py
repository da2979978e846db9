"""PyTorch's SDPA backends as attention kernels, each forced to one backend (tasks/attention/sdpa.py).

No GPU here: the CUDA entries' own ``compute`` functions run on CPU tensors (SDPA's flash and math
backends exist on the CPU), which is the code the GPU runs, device aside.  A backend that cannot
take the inputs must raise, never hand the call to another backend.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tasks.attention import AttentionError, AttentionKernel, get_attention, list_attention
from tasks.attention import registry as reg
from tasks.attention.sdpa import BACKENDS, FUSED_ALGORITHM, SDPA_NAMES, sdpa_attention
from tasks.checks.attention import draw, parse_algorithm

CUDA_ENTRIES = ("sdpa-flash-cuda", "sdpa-efficient-cuda", "sdpa-cudnn-cuda", "sdpa-math-cuda")
NO_CPU = ("sdpa-efficient-cpu", "sdpa-cudnn-cpu")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without CUDA says")


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]


@pytest.fixture()
def on_cpu() -> Iterator[dict[str, AttentionKernel]]:
    """The CUDA entries' compute functions registered as CPU kernels (flash and math: the two
    backends the CPU has), so that they run through the registry's call (GQA, masks, checks)."""
    kernels = {}
    for backend in ("flash", "math"):
        cuda = get_attention(sdpa_attention(backend, "cuda"))
        kern = AttentionKernel(name=f"test-{cuda.name}-on-cpu", device="cpu", compute=cuda.compute,
                               gqa=cuda.gqa, logsumexp=cuda.logsumexp, algorithm=cuda.algorithm,
                               description="test")
        reg.register_attention(kern)
        kernels[backend] = kern
    yield kernels
    for kern in kernels.values():
        reg._unregister(kern.name)


def test_every_backend_and_device_has_an_entry() -> None:
    rows = {r["name"]: r for r in list_attention()}
    assert set(SDPA_NAMES.values()) <= set(rows)
    for (backend, device), name in SDPA_NAMES.items():
        assert sdpa_attention(backend, device) == name and rows[name]["device"] == device
    assert sdpa_attention("flash") == "sdpa-flash-cuda"  # cuda is the default device
    # On the CPU, the flash and math backends are the entries that already exist
    assert sdpa_attention("flash", "cpu") == "sdpa-flash-cpu" and sdpa_attention("math", "cpu") == "sdpa-math"
    with pytest.raises(AttentionError, match="no SDPA entry for backend 'fast'"):
        sdpa_attention("fast", "cpu")
    with pytest.raises(AttentionError, match="devices: cuda, cpu"):
        sdpa_attention("flash", "xpu")


def test_declared_algorithms() -> None:
    algs = {n: get_attention(n).algorithm for n in CUDA_ENTRIES}
    assert algs == {"sdpa-flash-cuda": FUSED_ALGORITHM, "sdpa-efficient-cuda": FUSED_ALGORITHM,
                    "sdpa-cudnn-cuda": FUSED_ALGORITHM, "sdpa-math-cuda": "plain"}
    # fused-general: any blocking (no block size), exp2, reciprocal, weights in the inputs' format
    assert repr(parse_algorithm(FUSED_ALGORITHM, "bfloat16")[1]) == (
        "AttentionAlgorithm(online_softmax=True, exp2=True, weights='bf16', reciprocal=True)")
    assert "weights" not in repr(parse_algorithm(FUSED_ALGORITHM, "float32")[1])
    for name in CUDA_ENTRIES:
        assert get_attention(name).logsumexp.startswith("computed alongside")


def test_fused_general_is_wider_than_the_cpu_flash_preset() -> None:
    """Every element flash-cpu allows, fused-general allows too (it only widens the bound)."""
    q, k, v, mask, causal = draw((1, 2, 8, 600, 16), "large-logits", torch.bfloat16, 0)
    for dtype in ("float32", "bfloat16"):
        ops = (q.float(), k.float(), v.float()) if dtype == "float32" else (q, k, v)
        tight = parse_algorithm("flash-cpu", dtype)[1].tolerance(*ops, mask, causal, None)
        wide = parse_algorithm(FUSED_ALGORITHM, dtype)[1].tolerance(*ops, mask, causal, None)
        assert np.all(np.asarray(wide.out) >= np.asarray(tight.out))
        assert np.all(np.asarray(wide.logsumexp) >= np.asarray(tight.logsumexp))
        assert np.any(np.asarray(wide.out) > np.asarray(tight.out))


@no_cuda
def test_cuda_entries_are_unavailable_here_with_the_reason() -> None:
    rows = {r["name"]: r for r in list_attention()}
    q = k = v = torch.zeros((1, 1, 2, 8))
    for name in CUDA_ENTRIES:
        assert rows[name]["available"] is False and "CUDA not available" in rows[name]["reason"]
        with pytest.raises(AttentionError, match="not available here: CUDA not available"):
            get_attention(name)(q, k, v)


def test_efficient_and_cudnn_have_no_cpu_counterpart() -> None:
    rows = {r["name"]: r for r in list_attention()}
    assert "no CPU implementation of the memory-efficient" in rows["sdpa-efficient-cpu"]["reason"]
    assert "cuDNN attention is a CUDA library" in rows["sdpa-cudnn-cpu"]["reason"]
    q = k = v = torch.zeros((1, 1, 2, 8))
    for name in NO_CPU:
        assert rows[name]["available"] is False and "not substituted" in rows[name]["reason"]
        with pytest.raises(AttentionError, match="not available here"):
            get_attention(name)(q, k, v)


@pytest.mark.parametrize("backend", ["efficient", "cudnn"])
def test_a_backend_the_cpu_lacks_raises_instead_of_running_another(backend: str) -> None:
    """The CUDA entry's own compute, given CPU tensors: SDPA has no such CPU backend, and with only it
    allowed the call raises (unforced, SDPA would have answered with flash or math bits)."""
    q, k, v, _, _ = draw((1, 2, 8, 8, 16), "randn", torch.float32, 0)
    compute = get_attention(sdpa_attention(backend, "cuda")).compute
    assert compute is not None
    with pytest.raises(AttentionError, match=f"SDPA backend {BACKENDS[backend]} cannot take these inputs.*"
                                             "no other one ran"):
        compute(q, k, v, None, False, 0.25)
    assert torch.nn.functional.scaled_dot_product_attention(q, k, v).shape == q.shape  # unforced: it runs


def test_flash_given_inputs_it_cannot_take_raises_with_torchs_reason() -> None:
    """CPU flash takes no value head size different from the key's: forced, that is an error naming
    torch's reason; unforced, SDPA silently runs the math backend instead."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn((1, 2, 5, 16), generator=g), torch.randn((1, 2, 7, 16), generator=g), \
        torch.randn((1, 2, 7, 8), generator=g)
    compute = get_attention("sdpa-flash-cuda").compute
    assert compute is not None
    with pytest.raises(AttentionError, match="FLASH_ATTENTION cannot take these inputs.*same last dimension"):
        compute(q, k, v, None, False, 0.25)
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        math = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.25)
    assert torch.equal(torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.25), math)


@pytest.mark.parametrize("name", CUDA_ENTRIES)
def test_exactly_one_backend_is_enabled_during_the_call(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, bool]] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        b = torch.backends.cuda
        seen.append({"FLASH_ATTENTION": b.flash_sdp_enabled(), "EFFICIENT_ATTENTION": b.mem_efficient_sdp_enabled(),
                     "CUDNN_ATTENTION": b.cudnn_sdp_enabled(), "MATH": b.math_sdp_enabled()})
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    kernel = get_attention(name)
    assert kernel.compute is not None
    q, k, v, _, _ = draw((1, 2, 8, 8, 16), "randn", torch.float32, 0)
    try:
        kernel.compute(q, k, v, None, True, 0.25)
    except AttentionError:
        pass  # efficient and cuDNN have no CPU backend: what matters is what was allowed
    member = BACKENDS[name.removeprefix("sdpa-").removesuffix("-cuda")]
    assert seen == [{m: m == member for m in BACKENDS.values()}]
    # and the global setting is restored afterwards
    b = torch.backends.cuda
    assert b.flash_sdp_enabled() and b.mem_efficient_sdp_enabled() and b.math_sdp_enabled()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["randn", "causal", "alibi", "padded", "large-logits"])
def test_cuda_compute_on_cpu_is_the_cpu_entries_output_and_within_its_bound(
        dtype: torch.dtype, kind: str, on_cpu: dict[str, AttentionKernel]) -> None:
    """Flash and math through the CUDA entries' compute on CPU tensors, with GQA (4 query heads on 2
    key heads): bit for bit the outputs of sdpa-flash-cpu and sdpa-math, and every output and
    logsumexp within the bounds of the algorithm the CUDA entry declares."""
    length, keys = (24, 24) if kind == "causal" else (24, 40)
    q, k, v, mask, causal = draw((2, 4, length, keys, 16), kind, dtype, 7)
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    for backend, cpu_name in (("flash", "sdpa-flash-cpu"), ("math", "sdpa-math")):
        kern = on_cpu[backend]
        out, lse = kern(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
        ref, _ = get_attention(cpu_name)(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
        assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == q.shape[:3]
        assert torch.equal(out, ref), (backend, kind)
        assert kern.algorithm is not None
        alg = parse_algorithm(kern.algorithm, _dtype_name(dtype))[1]
        cover = alg.covers(out, q, k, v, mask, causal, None, enable_gqa=True, logsumexp=lse)
        assert cover.all(), (backend, kind, int((~np.asarray(cover.out)).sum()),
                             int((~np.asarray(cover.logsumexp)).sum()))


def test_the_logsumexp_alongside_is_the_same_for_flash_and_math(on_cpu: dict[str, AttentionKernel]) -> None:
    q, k, v, _, _ = draw((1, 2, 16, 16, 8), "causal", torch.float32, 3)
    lses = [on_cpu[b](q, k, v, is_causal=True)[1] for b in ("flash", "math")]
    assert torch.equal(lses[0], lses[1]) and torch.equal(lses[1], get_attention("sdpa-math")(q, k, v, is_causal=True)[1])


def test_check_attention_holds_the_cuda_flash_compute_to_fused_general(on_cpu: dict[str, AttentionKernel]) -> None:
    from tasks.checks.attention import run_attention_check

    res = run_attention_check(on_cpu["flash"].name, FUSED_ALGORITHM, "bfloat16", shapes=["1x2x20x20x16"],
                              inputs=("randn", "causal", "padded"), trials=1, ulps=8)
    assert res.verdict.passed and res.positions > 0 and res.mismatches == 0, res.text()


def test_kernels_attention_cli_lists_the_sdpa_entries_with_their_algorithms() -> None:
    res = CliRunner().invoke(app, ["kernels", "attention", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert rows["sdpa-flash-cuda"]["algorithm"] == FUSED_ALGORITHM and rows["sdpa-math-cuda"]["algorithm"] == "plain"
    assert rows["sdpa-flash-cpu"]["algorithm"] == "flash-cpu" and rows["sdpa-efficient-cpu"]["available"] is False
    assert "SDPBackend.FLASH_ATTENTION" in rows["sdpa-flash-cuda"]["description"]


def test_a_spec_naming_a_backend_without_a_cpu_counterpart_is_refused_with_the_reason(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text('name = "t"\nquestion = "q"\n[experiments.a]\nkind = "batch_invariance"\nlevel = "kernel"\n'
                    'attention_kernels = ["sdpa-math", "sdpa-efficient-cpu"]\nm = [1, 2]\n')
    res = CliRunner().invoke(app, ["sweep", "validate", str(spec)])
    assert res.exit_code == 2 and "attention_kernels[1]" in res.output
    assert "no CPU implementation of the memory-efficient SDPA backend" in res.output
