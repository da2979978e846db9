"""The ``kdepth`` task: one GEMM shape and seed, every implementation and the exact reference.

Operands are drawn the way a real W8A8 layer produces them (reference/vllm-kernels.md §2.6):

* int8 activations: per-token scale ``sa = absmax(row) / 127`` (fp32) and
  ``q = round_half_even(x * (127 / absmax))`` saturated to [-128, 127], as ``scaled_int8_quant``;
  int8 weights: per-channel ``sb = absmax(column) / 127`` and ``round(w / sb)`` in [-127, 127];
* fp8 e4m3: the analogue with 448, ``x / s`` cast to e4m3 (round to nearest even), clamped to ±448.

Scale mode ``pow2`` rounds every scale UP to a power of two before quantizing (so nothing saturates);
multiplying by a power of two is exact, so under ``pow2`` all epilogue orders must agree bit for bit.
The same seed draws the same real-valued ``x`` and ``w`` in both scale modes, so the modes are paired.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np
import torch

OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
QMAX = {"int8": 127.0, "fp8_e4m3": 448.0}
#: Outputs at least this fraction of max|reference| count for ``max_spacing_significant``: spacing
#: counts near zero run through every tiny binade and say little (reference/numerics.md §5.1).
SIGNIFICANT = 0.05


def _stable_seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & (2**63 - 1)


def _pow2_up(s: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.ceil(torch.log2(s.double()))).float()


def _scales(absmax: torch.Tensor, qmax: float, mode: str) -> torch.Tensor:
    s = absmax.float() / qmax
    if mode == "pow2":
        s = _pow2_up(s)
    return s


def draw_operands(
    dtype: str, m: int, n: int, k: int, seed: int, scale_mode: str, out_dtype: str = "bf16", bias: bool = False
) -> dict[str, Any]:
    """Quantized operands, scales and bias of one unit (deterministic in the parameters)."""
    g = torch.Generator().manual_seed(_stable_seed("kdepth", dtype, m, n, k, seed))
    x = torch.randn(m, k, generator=g, dtype=torch.float32)
    w = torch.randn(k, n, generator=g, dtype=torch.float32)
    bias_t = (torch.randn(n, generator=g, dtype=torch.float32)).to(OUT_DTYPES[out_dtype]) if bias else None
    qmax = QMAX[dtype]
    amax_x = x.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    amax_w = w.abs().amax(dim=0, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    sa = _scales(amax_x, qmax, scale_mode)  # [M, 1]
    sb = _scales(amax_w, qmax, scale_mode)  # [1, N]
    if dtype == "int8":
        if scale_mode == "real":
            # scaled_int8_quant multiplies by 127/absmax, not by 1/scale (vllm-kernels.md §2.6).
            a = torch.round(x * (qmax / amax_x.float())).clamp(-128, 127).to(torch.int8)
        else:
            a = torch.round(x / sa).clamp(-128, 127).to(torch.int8)
        b = torch.round(w / sb).clamp(-127, 127).to(torch.int8)
    elif dtype == "fp8_e4m3":
        a = (x / sa).clamp(-qmax, qmax).to(torch.float8_e4m3fn)
        b = (w / sb).clamp(-qmax, qmax).to(torch.float8_e4m3fn)
    else:
        raise ValueError(f"unknown operand dtype {dtype!r}; allowed: int8, fp8_e4m3")
    return {"a": a, "b": b, "scale_a": sa.contiguous(), "scale_b": sb.reshape(n).contiguous(), "bias": bias_t}


def compare(out_a: torch.Tensor, out_b: torch.Tensor, fmt: Any) -> dict[str, Any]:
    """Bitwise and spacing statistics of two outputs of one format (``out_b`` the reference side)."""
    from tasks.numerics import distance

    d = np.asarray(distance(out_a, out_b, fmt)).reshape(-1)
    va = out_a.double().numpy().reshape(-1)
    vb = out_b.double().numpy().reshape(-1)
    differs = d != 0
    nonfinite = differs & ~(np.isfinite(va) & np.isfinite(vb))
    comparable = d >= 0
    finite = np.isfinite(va) & np.isfinite(vb)
    abs_err = np.zeros_like(va)
    abs_err[finite] = np.abs(va[finite] - vb[finite])
    big = np.abs(vb) >= SIGNIFICANT * np.max(np.abs(np.where(np.isfinite(vb), vb, 0.0)), initial=0.0)
    worst = int(np.argmax(np.where(comparable, d, -1))) if d.size else 0
    n_cols = out_a.shape[-1] if out_a.dim() > 1 else 1
    return {
        "elements": int(d.size),
        "differing": int(differs.sum()),
        "frac_differing": float(differs.mean()) if d.size else 0.0,
        "max_spacing": int(d[comparable].max(initial=0)),
        "max_spacing_significant": int(d[comparable & big].max(initial=0)),
        "hist_0": int((d == 0).sum()),
        "hist_1": int((d == 1).sum()),
        "hist_2": int((d == 2).sum()),
        "hist_gt2": int((d > 2).sum()),
        "nonfinite_mismatch": int(nonfinite.sum()),
        "max_abs_error": float(abs_err.max(initial=0.0)),
        "worst_row": worst // n_cols,
        "worst_col": worst % n_cols,
        "worst_a": float(va[worst]) if d.size else None,
        "worst_b": float(vb[worst]) if d.size else None,
    }


def run(params: dict[str, Any], context: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Compute one unit's rows: every pair of implementations, and each against the reference."""
    from tasks.kernels import get_kernel
    from tasks.numerics import get_format

    ops = draw_operands(
        params["dtype"], params["m"], params["n"], params["k"], params["seed"],
        params["scale_mode"], params["out_dtype"], params["bias"],
    )
    out_dtype = OUT_DTYPES[params["out_dtype"]]
    fmt = get_format(out_dtype)
    outputs: dict[str, tuple[torch.Tensor, float, str]] = {}
    for impl in [*params["implementations"], params["reference"]]:
        kernel = get_kernel(impl["kernel"], **impl["params"])
        args = [ops["a"], ops["b"], ops["scale_a"], ops["scale_b"], out_dtype, ops["bias"]]
        if kernel.device == "cuda":  # GPU kernels take their operands on the device
            args = [x.cuda() if isinstance(x, torch.Tensor) else x for x in args]
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = kernel(*args)
        if kernel.device == "cuda":
            torch.cuda.synchronize()
        outputs[impl["name"]] = (out.cpu(), time.perf_counter() - t0, impl["kernel"])

    base = {
        "dtype": params["dtype"], "out_dtype": params["out_dtype"], "m": params["m"], "n": params["n"],
        "k": params["k"], "seed": params["seed"], "scale_mode": params["scale_mode"], "bias": params["bias"],
    }
    names = [i["name"] for i in params["implementations"]]
    ref = params["reference"]["name"]
    pairs = [("pair", a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    pairs += [("reference", a, ref) for a in names]
    rows = []
    for comparison, a, b in pairs:
        (oa, ta, ka), (ob, tb, kb) = outputs[a], outputs[b]
        rows.append({
            **base, "comparison": comparison, "impl_a": a, "impl_b": b, "kernel_a": ka, "kernel_b": kb,
            **compare(oa, ob, fmt), "seconds_a": ta, "seconds_b": tb,
        })
    return {"kdepth": rows}
