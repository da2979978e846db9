"""Tolerances by name: the closed-form bound of ``swapcheck tolerance`` and the per-element check of
``swapcheck.testing.assert_within_bound``, both from the project's error models.

The arithmetic lives in :mod:`tasks.numerics.tolerance` (formulas, :data:`~tasks.numerics.tolerance.VERSION`);
this module resolves the names a user types -- dtypes (``fp32``, ``bf16``, ``fp16``, ``fp8_e4m3``,
``int8``), accumulation formats (``fp32``, ``bf16``, ``fp16``, ``int32``) and algorithms
(:data:`tasks.checks.bounds.ALGORITHMS`: ``any``, ``sequential``, ``pairwise``, ``blocked-<b>``,
``exact``, ``slots16``) -- and refuses anything else with a :class:`ToleranceError` that names the
parameter and what is allowed.

Which error model: the algorithm in the accumulation format (:func:`tasks.checks.bounds.algorithm`).
Products that are exact values of the accumulation format (bf16, fp16, fp8 or int8 operands summed in
fp32, all products in its normal range) cannot tell a fused multiply-add from a plain one, so the
model with ``fma=True`` applies; otherwise the ``fma=False`` model, which covers both (docs/numerics.md).
``any`` is the matmul operation's bound: every order of additions, with or without FMA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from swapcheck_common.errors import InputError
from tasks.numerics.errormodel import Bounds
from tasks.numerics.formats import FORMATS, FloatFormat, get_format
from tasks.numerics.spacing import distance
from tasks.numerics.tolerance import (
    INT32_MAX,
    VERSION,
    Judgement,
    exact_model,
    gemm_tolerance,
    judge,
    near_tie,
)

__all__ = ["ToleranceError", "DTYPES", "ACCUMULATE", "tolerance", "BoundCheck", "check_within_bound"]

#: Operand dtypes of ``swapcheck tolerance --dtype`` (format aliases of tasks.numerics are accepted too).
DTYPES = ("fp32", "bf16", "fp16", "fp8_e4m3fn", "int8")
#: Accumulation formats (``--accumulate``, ``accumulate=``).
ACCUMULATE = ("fp32", "bf16", "fp16", "int32")
_INT = ("int8", "int32")


class ToleranceError(InputError):
    """Bad input to a tolerance (exit code 2): ``option`` is the parameter at fault."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option
        self.detail = message


def _key(value: Any) -> str:
    """A dtype's name: strings as typed, torch dtypes without ``torch.``, numpy dtypes and types by name."""
    if isinstance(value, str):
        return value.strip().lower().removeprefix("torch.")
    if isinstance(value, FloatFormat):
        return value.name
    if type(value).__module__ == "torch":
        return str(value).removeprefix("torch.")
    try:
        return str(np.dtype(value).name)
    except TypeError:
        return str(value)


def _dtype(option: str, value: Any, allowed: tuple[str, ...]) -> FloatFormat | str:
    """A FloatFormat, or ``"int8"`` / ``"int32"`` where ``allowed`` has them."""
    key = _key(value)
    if key in _INT and key in allowed:
        return key
    try:
        fmt: FloatFormat | None = get_format(key)
    except ValueError:
        fmt = None
    if fmt is None or fmt.name not in allowed:
        raise ToleranceError(option, f"{value!r} is not allowed; allowed: {', '.join(allowed)} "
                                     "(aliases: float32, bfloat16, float16, e4m3, fp8_e4m3; torch and numpy dtypes)")  # fmt: skip
    return fmt


def _algorithm(name: str, acc: FloatFormat, fma: bool) -> Any:
    from tasks.checks.bounds import ALGORITHMS, algorithm
    from tasks.checks.subject import CheckInputError

    try:
        return algorithm(name, acc.name, fma)
    except CheckInputError:
        raise ToleranceError("algorithm", f"unknown algorithm {name!r}; allowed: {', '.join(ALGORITHMS)} "
                                          "(e.g. blocked-128)") from None  # fmt: skip


def _model_name(name: str, alg: Any) -> str:
    return "any order (the matmul operation's bound)" if name.strip().lower() == "any" else repr(alg)


def _positive(option: str, value: float | None) -> float | None:
    if value is not None and not (np.isfinite(value) and value >= 0):
        raise ToleranceError(option, f"must be a finite number >= 0, got {value!r}")
    return value


def tolerance(dtype: str, k: int, *, algorithm: str = "any", accumulate: str | None = None,
              out_dtype: str | None = None, max_abs_a: float | None = None, max_abs_b: float | None = None,
              sum_abs: float | None = None, logit: float | None = None, fma: bool = False) -> dict[str, Any]:  # fmt: skip
    """The closed-form bound of one output of a K-term GEMM, as a JSON-able dict.

    Defaults: accumulate in int32 for int8, else fp32; the output in bf16 for fp8 and int8 operands
    (vLLM's scaled GEMMs; no scales here), int32 for int8 summed in int32 only when asked, else the
    operands' dtype; ``max_abs_a``/``max_abs_b`` 1 (128 and 127 for int8); ``sum_abs`` (sum over k
    of ``|a_k b_k|``) defaults to ``K * max_abs_a * max_abs_b``.  ``logit`` adds the near-tie
    threshold of a logit of that magnitude.  ``fma`` True: products never rounded (a narrower model
    for fp32 operands; for narrower operands in fp32 it changes the counts only).
    """
    op = _dtype("dtype", dtype, DTYPES)
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ToleranceError("k", f"must be an integer >= 1, got {k!r}")
    acc = _dtype("accumulate", accumulate or ("int32" if op == "int8" else "fp32"), ACCUMULATE)
    if acc == "int32" and op != "int8":
        raise ToleranceError("accumulate", f"int32 accumulates int8 operands only, not {op}; allowed for "
                                           f"{op}: fp32, bf16, fp16")  # fmt: skip
    default_out = "bf16" if op in ("int8",) or op == FORMATS["fp8_e4m3fn"] else op
    out = _dtype("out_dtype", out_dtype or default_out, ("fp32", "bf16", "fp16", "fp8_e4m3fn", "int32"))
    if out == "int32" and acc != "int32":
        raise ToleranceError("out_dtype", "int32 output needs int8 operands accumulated in int32")
    big = (128.0, 127.0) if op == "int8" else (1.0, 1.0)
    ma = _positive("max_abs_a", max_abs_a)
    mb = _positive("max_abs_b", max_abs_b)
    s = _positive("sum_abs", sum_abs)
    ma, mb = big[0] if ma is None else ma, big[1] if mb is None else mb
    s_val = float(k) * ma * mb if s is None else s
    if _positive("logit", logit) is not None and logit is not None and logit > s_val:
        raise ToleranceError("logit", f"|logit| = {logit!r} exceeds the sum of magnitudes {s_val!r}, the "
                                      "largest a K-term GEMM output can be: raise sum_abs or max_abs_a/max_abs_b")  # fmt: skip
    if isinstance(acc, str):  # int32
        if s_val > INT32_MAX:
            raise ToleranceError("k", f"K * max|a| * max|b| = {s_val:.6g} exceeds 2**31 - 1: an int32 accumulator "
                                      "can overflow (wrap), which no tolerance bounds; at full int8 range K <= 132104")  # fmt: skip
        model, alg_text, acc_fmt = exact_model(), "exact in int32 (any order)", None
        _algorithm(algorithm, FORMATS["fp32"], fma)  # validates the name
    else:
        alg = _algorithm(algorithm, acc, fma)
        model, alg_text, acc_fmt = alg.error_model(int(k)), _model_name(algorithm, alg), acc
    out_fmt = None if isinstance(out, str) or out == acc else out
    tol = gemm_tolerance(model, int(k), s_val, out_fmt, logit, acc_fmt)
    result: dict[str, Any] = {
        "derivation_version": VERSION, "source": tol.source,
        "error_model_source": "tasks.checks.bounds.algorithm -> tasks.numerics.products (error_model)",
        "dtype": _name(op), "accumulate": _name(acc), "out_dtype": _name(out), "k": int(k),
        "algorithm": algorithm, "model": alg_text, "fma": bool(fma) and not isinstance(acc, str),
        "magnitudes": {"max_abs_a": ma, "max_abs_b": mb, "sum_abs": s_val,
                       "from": "sum_abs" if s is not None else "k * max_abs_a * max_abs_b"},
        **{key: v for key, v in tol.to_dict().items() if key not in ("version", "source", "k", "sum_abs")},
        "formula": _formula(out_fmt is not None),
    }  # fmt: skip
    if logit is not None:
        logit_fmt = out_fmt if out_fmt is not None else acc_fmt
        result["near_tie"] = {key: (None if isinstance(v, float) and v != v else v)
                              for key, v in near_tie(tol, logit_fmt).items()}  # fmt: skip
    return result


def _name(x: FloatFormat | str) -> str:
    return x if isinstance(x, str) else x.name


def _formula(rounded: bool) -> str:
    acc = "E = gamma_n * S + N * eta * (1 + gamma_n), gamma_n = n u / (1 - n u), S = sum_k |a_k b_k|"
    if not rounded:
        return f"|out - exact| <= E; {acc}"
    return f"|out - exact| <= atol + rtol * |exact|, atol = E * (1 + u_out) + eta_out, rtol = u_out; {acc}"


# ---------------------------------------------------------------------------------------------------
# Per element


@dataclass
class BoundCheck:
    """The per-element verdict of :func:`check_within_bound`; ``message()`` explains a failure."""

    judgement: Judgement
    actual: np.ndarray
    k: int
    description: str
    #: the output's format: an element outside is also told in its spacings beyond the allowed range
    fmt: FloatFormat | None = None

    @property
    def outside(self) -> int:
        return int(self.judgement.covered.size - np.count_nonzero(self.judgement.covered))

    @property
    def passed(self) -> bool:
        return self.outside == 0

    def worst(self) -> tuple[int, int]:
        """(row, col) of the largest error in units of its bound."""
        flat = int(np.argmax(self.judgement.units)) if self.judgement.units.size else 0
        r, c = np.unravel_index(flat, self.judgement.units.shape)
        return int(r), int(c)

    def message(self, shown: int = 3) -> str:
        j, total = self.judgement, self.judgement.covered.size
        head = (f"{self.outside} of {total} elements ({100 * self.outside / max(total, 1):.3g}%) outside the bound "
                f"of {self.description} (K = {self.k}, swapcheck tolerance derivation v{VERSION})")  # fmt: skip
        order = np.argsort(-j.units, axis=None, kind="stable")[: max(shown, 1)]
        lines = [head]
        for n, flat in enumerate(order):
            r, c = (int(x) for x in np.unravel_index(int(flat), j.units.shape))
            if n and j.covered[r, c]:
                break
            label = "worst element" if n == 0 else "next"
            lines.append(f"{label} (row {r}, col {c}): error {_units(j.units[r, c])}: actual "
                         f"{float(self.actual[r, c])!r} vs exact {float(j.exact[r, c])!r}, allowed "
                         f"[{float(j.low[r, c])!r}, {float(j.high[r, c])!r}]{self._beyond(r, c)}, "
                         f"sum_k |a b| = {float(j.sum_abs[r, c]):.6g}")  # fmt: skip
        return "\n".join(lines)


    def _beyond(self, r: int, c: int) -> str:
        """``, N <fmt> spacings beyond the allowed range`` for an element outside it (ordered bit patterns)."""
        j, x = self.judgement, float(self.actual[r, c])
        if self.fmt is None or j.covered[r, c] or not np.isfinite(x):
            return ""
        end = float(j.high[r, c]) if x > float(j.high[r, c]) else float(j.low[r, c])
        if not np.isfinite(end):
            return ""
        try:
            d = int(distance(np.array([x]), np.array([end]), self.fmt)[0])
        except ValueError:  # a value the format cannot hold exactly (an int32 output): no spacing count
            return ""
        return f", {d} {self.fmt.name} spacing{'s' if d != 1 else ''} beyond the allowed range"


def _units(x: float) -> str:
    if not np.isfinite(x):  # the allowed range lies wholly on the other side of the exact result
        return "beyond its bound, which allows no error on that side of the exact result"
    return f"{x:.4g} times its bound"


def _products_exact(a: Any, b: Any, a64: np.ndarray, b64: np.ndarray, acc: FloatFormat) -> bool:
    """Is every product an exact normal (or zero) value of ``acc``?  Then FMA changes nothing."""
    def precision(x: Any) -> int:
        try:
            return get_format(x.dtype).precision
        except (ValueError, AttributeError):
            return 8 if str(getattr(x, "dtype", "")).endswith("int8") else 64
    if precision(a) + precision(b) > acc.precision:
        return False
    na, nb = np.abs(a64[a64 != 0]), np.abs(b64[b64 != 0])
    if na.size == 0 or nb.size == 0:
        return True
    if not (np.all(np.isfinite(na)) and np.all(np.isfinite(nb))):
        return False
    return bool(na.min() * nb.min() >= acc.min_normal and na.max() * nb.max() <= acc.max_finite)


def check_within_bound(actual: Any, a: Any, b: Any, *, out_dtype: Any, algorithm: str,
                       accumulate: Any = "fp32") -> BoundCheck:  # fmt: skip
    """Every element of ``actual`` (``[M, N]``) against the bound of ``a @ b`` (``[M, K] @ [K, N]``)."""
    from tasks.numerics.accumulation import to_float64

    act, _ = to_float64(actual)
    a64, _ = to_float64(a)
    b64, _ = to_float64(b)
    if a64.ndim != 2 or b64.ndim != 2 or a64.shape[1] != b64.shape[0]:
        raise ToleranceError("a, b", f"need matrices [M, K] and [K, N], got {tuple(a64.shape)} and {tuple(b64.shape)}")
    if act.shape != (a64.shape[0], b64.shape[1]):
        raise ToleranceError("actual", f"shape {tuple(act.shape)} is not [M, N] = {(a64.shape[0], b64.shape[1])}")
    acc = _dtype("accumulate", accumulate, ACCUMULATE)
    out = _dtype("out_dtype", out_dtype, ("fp32", "bf16", "fp16", "fp8_e4m3fn", "fp8_e5m2", "int32"))
    k = int(a64.shape[1])
    if isinstance(acc, str):  # int32: exact below overflow
        _algorithm(algorithm, FORMATS["fp32"], True)
        bounds, description = _int32_bounds(a64, b64), "exact int32 accumulation"
    else:
        if out == "int32":
            raise ToleranceError("out_dtype", "int32 output needs accumulate='int32'")
        alg = _algorithm(algorithm, acc, _products_exact(a, b, a64, b64, acc))
        bounds, description = alg.bounds(a, b), f"{_model_name(algorithm, alg)} in {acc.name}"
    out_fmt = None if isinstance(out, str) else out
    if out_fmt is not None and out_fmt != bounds.fmt:
        description += f", then one rounding to {out_fmt.name}"
    fmt = out_fmt if out_fmt is not None else None if isinstance(acc, str) else bounds.fmt
    return BoundCheck(judge(act, bounds, out_fmt), act, k, description, fmt)


def _int32_bounds(a64: np.ndarray, b64: np.ndarray) -> Bounds:
    if not (np.all(a64 == np.round(a64)) and np.all(b64 == np.round(b64))):
        raise ToleranceError("accumulate", "int32 accumulation needs integer operands (int8 values)")
    ai, bi = a64.astype(np.int64), b64.astype(np.int64)
    s = np.abs(ai) @ np.abs(bi)
    if s.size and int(s.max()) > INT32_MAX:
        raise ToleranceError("accumulate", f"a partial sum can reach {int(s.max())} > 2**31 - 1: an int32 "
                                           "accumulator can overflow (wrap), which no tolerance bounds")  # fmt: skip
    exact = (ai @ bi).astype(np.float64)  # exact: |values| < 2**31
    z = np.zeros_like(exact, dtype=bool)
    s64 = s.astype(np.float64)
    return Bounds(FORMATS["fp32"], exact_model(), exact, np.zeros_like(exact), np.zeros_like(exact), s64,
                  (s64 + exact) / 2, (s64 - exact) / 2, z, z, z)  # fmt: skip
