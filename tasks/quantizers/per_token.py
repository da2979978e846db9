"""Per-token symmetric activation quantizers (INT8 and FP8 e4m3), CPU implementations, bit-exact.

Notation: ``fl32(.)`` is one correctly rounded fp32 operation (round to nearest even), ``fl16`` the
same into fp16, ``C`` the format's top value (127 for INT8, 448 for FP8 e4m3), rows ``i`` are tokens.
One instance computes, per row (the parameters choose each step; docs/quantizers.md):

1. ``amax = max_j |x[i, j]|`` (exact: a maximum of fp32 values); with ``eps > 0``,
   ``amax = max(amax, fl32(eps))`` (a clamp epsilon on amax).
2. the scale, ``s``: ``scale = "divide"``: ``fl32(amax / C)``; ``scale = "mul-recip"``:
   ``fl32(amax * fl32(1 / C))``; then, with ``min_scale > 0``, ``s = max(s, fl32(min_scale))``.
   ``mode = "static"``: ``s = fl32(static_scale)`` for every row (steps 1-2 skipped).
3. the stored scale: ``scale_dtype = "fp32"``: ``s``; ``"fp16"``: ``fl16(s)`` (the GEMM reads it back
   as fp32, exactly).  ``su`` below is the stored scale's value.
4. the value to round, ``v``: ``apply = "inv-amax"``: ``fl32(x * fl32(C / amax))`` (vLLM's dynamic INT8
   kernel: it multiplies by ``127/absmax``, it does not divide by the stored scale);
   ``"divide"``: ``fl32(x / su)``; ``"mul-inv"``: ``fl32(x * fl32(1 / su))``.
5. INT8: ``q = clamp(round(v), -128, 127)`` with ``rounding = "even"`` (half to even, PTX
   ``cvt.rni.sat.s8.f32``) or ``"away"`` (half away from zero, ``roundf`` / libdevice ``round``);
   a NaN ``v`` (``0 * inf`` or ``0 / 0`` in a zero row) becomes 0, as ``cvt.rni.sat`` makes it, and
   ``+-inf`` saturates.  FP8: ``r = fmaxf(-448, fminf(v, 448))`` (a NaN ``v`` becomes +448, since
   ``fminf`` returns its non-NaN operand), then ``q = e4m3(r)`` rounded to nearest with ties to even
   (``rounding = "even"``, the CUDA conversion) or away.

Every fp32 step above runs as a torch fp32 tensor-tensor operation on the CPU (IEEE, one rounding
each); away-from-zero rounding runs in float64, where ``|v| + 0.5`` is exact.  tests/test_quantizers.py
checks every preset bit for bit against an exact oracle in fractions.
"""

from __future__ import annotations

import abc
import math
from typing import TYPE_CHECKING, Any, ClassVar

from tasks.quantizers.registry import Quantizer, QuantizerError

if TYPE_CHECKING:
    import torch

__all__ = ["PerTokenQuantizer", "Int8PerToken", "Fp8PerToken", "FP8_MIN_SCALE"]

#: vLLM's dynamic per-token FP8 floor on the scale: ``1 / (448 * 512)`` (csrc/.../fp8/common.cu).
FP8_MIN_SCALE = 1.0 / (448.0 * 512.0)

_CHOICES: dict[str, tuple[str, ...]] = {
    "mode": ("dynamic", "static"),
    "rounding": ("even", "away"),
    "scale": ("divide", "mul-recip"),
    "apply": ("inv-amax", "divide", "mul-inv"),
    "scale_dtype": ("fp32", "fp16"),
}


class PerTokenQuantizer(Quantizer):
    """Symmetric per-token quantization into ``[-C, C]`` (module docstring, steps 1-5)."""

    qmax: ClassVar[float] = 0.0
    param_defaults: ClassVar[dict[str, Any]] = {
        "mode": "dynamic", "rounding": "even", "scale": "divide", "apply": "inv-amax", "scale_dtype": "fp32",
        "eps": 0.0, "min_scale": 0.0, "static_scale": None,
    }

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        for key, choices in _CHOICES.items():
            if params[key] not in choices:
                raise QuantizerError(f"quantizer {self.name!r}: {key}={params[key]!r} is not allowed; "
                                     f"choose one of {', '.join(repr(c) for c in choices)}")
        for key in ("eps", "min_scale"):
            v = params[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise QuantizerError(f"quantizer {self.name!r}: {key} must be a finite number >= 0, got {v!r}")
            params[key] = float(v)
        st = params["static_scale"]
        if params["mode"] == "static":
            if isinstance(st, bool) or not isinstance(st, int | float) or not math.isfinite(st) or st <= 0:
                raise QuantizerError(f"quantizer {self.name!r} is static: it needs static_scale = <a positive "
                                     f"number> (the calibrated per-tensor scale), got {st!r}")
            if params["apply"] == "inv-amax":
                raise QuantizerError(f"quantizer {self.name!r}: a static quantizer has no amax; "
                                     "use apply = 'divide' or 'mul-inv'")
            params["static_scale"] = float(st)
        elif st is not None:
            raise QuantizerError(f"quantizer {self.name!r}: static_scale is for mode = 'static' only")
        return params

    # -- the formula in words ---------------------------------------------------------------------
    def formula(self) -> str:
        p, c = self.params, f"{self.qmax:g}"
        if p["mode"] == "static":
            s = f"s = fl32({p['static_scale']!r})"
        else:
            amax = "amax" if p["eps"] == 0 else f"max(amax, fl32({p['eps']!r}))"
            s = f"s = fl32({amax} / {c})" if p["scale"] == "divide" else f"s = fl32({amax} * fl32(1/{c}))"
            if p["min_scale"] > 0:
                s = f"{s}; s = max(s, fl32({p['min_scale']!r}))"
        su = "fl16(s)" if p["scale_dtype"] == "fp16" else "s"
        amax_v = "amax" if p["eps"] == 0 else "max(amax, eps)"
        v = {"inv-amax": f"fl32(x * fl32({c} / {amax_v}))", "divide": "fl32(x / su)",
             "mul-inv": "fl32(x * fl32(1 / su))"}[p["apply"]]
        tie = "half to even" if p["rounding"] == "even" else "half away from zero"
        if self.out_dtype == "int8":
            q = f"q = clamp(round_{p['rounding']}({v}), -128, 127) (ties {tie}; NaN -> 0)"
        else:
            q = f"q = e4m3_{p['rounding']}(clamp({v}, -448, 448)) (ties {tie}; NaN -> 448)"
        return f"{s}; stored scale su = {su}; {q}"

    # -- the computation ----------------------------------------------------------------------------
    def scales(self, xf: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(amax, stored scale)`` per row, ``[M, 1]`` each (``amax`` None when static)."""
        import torch

        p = self.params
        m = xf.shape[0]

        def full(v: float) -> torch.Tensor:  # fl32(v): the double rounded once to fp32
            return torch.full((m, 1), v, dtype=torch.float32)

        amax: torch.Tensor | None
        if p["mode"] == "static":
            amax, s = None, full(p["static_scale"])
        else:
            amax = xf.abs().amax(dim=1, keepdim=True)
            if p["eps"] > 0:
                amax = torch.maximum(amax, full(p["eps"]))
            # tensor / tensor: a true division (a Python scalar divisor may become a reciprocal multiply)
            s = amax / full(self.qmax) if p["scale"] == "divide" else amax * full(1.0 / self.qmax)
            if p["min_scale"] > 0:
                s = torch.maximum(s, full(p["min_scale"]))
        stored = s.to(torch.float16) if p["scale_dtype"] == "fp16" else s
        return amax, stored

    def values(self, xf: torch.Tensor, amax: torch.Tensor | None, stored: torch.Tensor) -> torch.Tensor:
        """``v`` (step 4), fp32 ``[M, K]``."""
        import torch

        su = stored.to(torch.float32)
        apply = self.params["apply"]
        if apply == "inv-amax":
            assert amax is not None  # check_params refuses inv-amax for static quantizers
            return xf * (torch.full_like(amax, self.qmax) / amax)
        if apply == "divide":
            return xf / su
        return xf * (torch.ones_like(su) / su)

    def compute(self, xf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if xf.shape[1] == 0:
            raise QuantizerError(f"quantizer {self.name!r}: a row needs at least one value (hidden >= 1)")
        amax, stored = self.scales(xf)
        return self.round(self.values(xf, amax, stored)), stored

    @abc.abstractmethod
    def round(self, v: torch.Tensor) -> torch.Tensor:
        """``q`` from ``v`` (step 5): the output format's rounding, saturation and NaN rule."""


class Int8PerToken(PerTokenQuantizer):
    """Per-token INT8: ``q`` int8 in [-128, 127] (module docstring)."""

    out_dtype = "int8"
    qmax = 127.0

    def round(self, v: torch.Tensor) -> torch.Tensor:
        import torch

        v = torch.where(torch.isnan(v), torch.zeros_like(v), v)
        if self.params["rounding"] == "even":
            r = torch.round(v)  # half to even
        else:
            vd = v.double()  # |v| + 0.5 is exact in float64 for every fp32 |v| < 2**52
            r = torch.where(vd < 0, -torch.floor(-vd + 0.5), torch.floor(vd + 0.5))
        return r.clamp(-128, 127).to(torch.int8)


class Fp8PerToken(PerTokenQuantizer):
    """Per-token FP8 e4m3 (``float8_e4m3fn``): ``q`` in [-448, 448] (module docstring)."""

    out_dtype = "fp8_e4m3"
    qmax = 448.0
    param_defaults: ClassVar[dict[str, Any]] = {**PerTokenQuantizer.param_defaults, "apply": "divide",
                                                "min_scale": FP8_MIN_SCALE}

    def round(self, v: torch.Tensor) -> torch.Tensor:
        import torch

        v = torch.where(torch.isnan(v), torch.full_like(v, 448.0), v).clamp(-448.0, 448.0)
        if self.params["rounding"] == "even":
            return v.to(torch.float8_e4m3fn)  # round to nearest even (c10 fp8e4m3fn_from_fp32_value)
        from tasks.numerics.rounding import NEAREST_AWAY, round_to_format

        r = round_to_format(v.double().numpy(), "fp8_e4m3fn", rounding=NEAREST_AWAY)
        return torch.from_numpy(r).reshape(v.shape).to(torch.float8_e4m3fn)  # exact: r is on the e4m3 grid
