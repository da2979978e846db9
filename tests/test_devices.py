"""tasks.devices.on_device: the one "run a kernel on its device" of tasks/ (kinds, checks)."""

from __future__ import annotations

import pytest
import torch

from tasks.devices import cuda_reason, on_device


def test_on_device_calls_with_tensors_on_the_device_and_returns_cpu_tensors_and_seconds() -> None:
    seen: list[str] = []

    def fn(a: torch.Tensor, pair: tuple[torch.Tensor, int], scale: float, *, bias: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        seen.extend(x.device.type for x in (a, pair[0]))
        assert pair[1] == 3 and scale == 0.5 and bias is None
        return a * scale, [pair[0]]

    a = torch.arange(4.0)
    (out, rest), seconds = on_device("cpu", fn, a, (a, 3), 0.5, bias=None)
    assert seen == ["cpu", "cpu"] and torch.equal(out, a * 0.5) and rest[0] is a  # on the CPU: no copies
    assert isinstance(rest, list) and seconds >= 0.0


@pytest.mark.skipif(cuda_reason() is not None, reason="needs a CUDA device")
def test_on_device_moves_to_cuda_and_back() -> None:
    out, _ = on_device("cuda", lambda x: (x.device.type, x + 1), torch.ones(2))
    assert out[0] == "cuda" and out[1].device.type == "cpu" and torch.equal(out[1], torch.full((2,), 2.0))


def test_isa_level_names_what_the_gemm_libraries_may_use() -> None:
    from tasks.devices import isa_level, mkl_isa

    amx = ["avx2", "avx512f", "avx512bw", "avx512_vnni", "amx_int8", "amx_tile"]
    assert isa_level(amx, {}, "AVX512") == "AMX"
    assert isa_level(["avx2", "avx512f", "avx512bw", "avx512_vnni"], {}, "AVX512") == "AVX512-VNNI"
    assert isa_level(["avx2", "avx512f", "avx512bw"], {}, "AVX512") == "AVX512"
    assert isa_level(["avx2", "avx_vnni"], {}, "AVX2") == "AVX2"  # torch's AVX2 capability caps it
    assert isa_level(["avx2", "fma"], {}, "AVX2") == "AVX2"
    assert isa_level(["avx", "fma"], {}, "DEFAULT") == "baseline"
    # oneDNN capped below the hardware: what an AVX2 machine runs (docs/development.md)
    assert isa_level(amx, {"ONEDNN_MAX_CPU_ISA": "avx2"}, "AVX512") == "AVX2"
    assert isa_level(amx, {"DNNL_MAX_CPU_ISA": "AVX512_CORE_VNNI"}, "AVX512") == "AVX512-VNNI"
    assert isa_level(amx, {"ONEDNN_MAX_CPU_ISA": "ALL"}, "AVX512") == "AMX"
    # MKL runs AVX-512 kernels on Intel CPUs only
    assert mkl_isa("GenuineIntel", "AMX", {}) == "AVX-512"
    assert mkl_isa("AuthenticAMD", "AVX512-VNNI", {}) == "AVX2"
    assert mkl_isa("GenuineIntel", "AVX512", {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}) == "AVX2"
    assert mkl_isa("GenuineIntel", "AVX2", {}) == "AVX2"
