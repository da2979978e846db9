"""Attention swaps: the pieces of an attention pair's certificate that differ from a GEMM pair's.

An attention pair is two attention kernels (tasks.attention registry names).  Its evidence has the
sections of a GEMM pair's certificate (reports/certificate.py):

* ``replay`` from ``attention_replay_pairs`` (the per-layer replay of captured q, k, v), rows of the
  model's activation dtype (float32 for the tiny W8A8 model); the other dtypes and the logsumexp
  figures are listed per dtype beside it (:func:`replay_rows`);
* ``end_to_end`` from ``cross_arm``: arm pairs that ran the same GEMM kernel and the same activation
  quantizer under the same scales and differ only in their attention kernel (:func:`arm_pairs`), with each arm's self-reproducibility
  and the teacher-forced flips of each pair read alone;
* ``kdepth`` is not run (there is no K axis).

``max_spacing_beyond_reference_error`` of an attention pair is the pair's largest replay distance
minus the larger of the two kernels' own largest distances from the float64 attention (the
``reference`` rows), floored at 0: how far the two differ beyond what either is from the definition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reports import spacing

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["ACTIVATION_DTYPE", "NOT_RUN", "answer_detail", "arm_pairs", "bound_checks", "beyond_reference", "pair_order", "per_dtype", "replay_rows",
           "replay_section"]

#: The dtype the tiny W8A8 model's attention runs in (its activations between layers are fp32).
ACTIVATION_DTYPE = "float32"
NOT_RUN = "not run"
#: The near-zero fields (reports/spacing.py) beside the normal-range max, as in a GEMM pair's sections.
NEAR_ZERO_KEYS = ("near_zero_beyond", "near_zero_beyond_exact", "near_zero_max_spacing", "near_zero_worst_abs_error",
                  "max_abs_error")


def replay_rows(cat: Catalog, sweep: str) -> list[dict[str, Any]]:
    """``attention_replay_pairs`` rows of one sweep (pair and reference comparisons, every dtype)."""
    return cat.named("attention_replay_pairs", sweep=sweep)


def _unordered(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def arm_pairs(cross: list[dict[str, Any]], quantizers: dict[str, str | None] | None = None) -> list[dict[str, Any]]:
    """``cross_arm`` rows of arms that differ only in their attention kernel (same GEMM kernel, same
    scales, same activation quantizer -- ``quantizers``: each arm's, ``reports.quantizer_swap.arm_quantizers``
    -- both attention kernels known), with ``kernel_a``/``kernel_b`` set to the attention kernels."""
    qs = quantizers or {}
    out = []
    for c in cross:
        if (c["same_scales"] and c["kernel_a"] and c["kernel_a"] == c["kernel_b"]
                and qs.get(c["arm_a"]) == qs.get(c["arm_b"]) and c.get("attention_a")
                and c.get("attention_b") and c["attention_a"] != c["attention_b"]):
            out.append({**c, "kernel_a": c["attention_a"], "kernel_b": c["attention_b"],
                        "gemm_kernel": c["kernel_a"]})
    return out


def pair_order(replay: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[str, str]]:
    """Every attention pair seen (unordered key -> the order it was first named in)."""
    order: dict[tuple[str, str], tuple[str, str]] = {}
    for r in replay:
        if r["comparison"] == "pair":
            order.setdefault(_unordered(r["impl_a"], r["impl_b"]), (r["impl_a"], r["impl_b"]))
    for c in pairs:
        order.setdefault(_unordered(c["kernel_a"], c["kernel_b"]), (c["kernel_a"], c["kernel_b"]))
    return order


def _pair_rows(replay: list[dict[str, Any]], key: tuple[str, str]) -> list[dict[str, Any]]:
    return [r for r in replay if r["comparison"] == "pair" and _unordered(r["impl_a"], r["impl_b"]) == key]


def replay_section(replay: list[dict[str, Any]], key: tuple[str, str]) -> dict[str, Any]:
    """The ``replay`` section of an attention pair: its rows of :data:`ACTIVATION_DTYPE` (of every dtype
    replayed when that one was not), in the shape of a GEMM pair's replay section."""
    rows = _pair_rows(replay, key)
    own = [r for r in rows if r["dtype"] == ACTIVATION_DTYPE] or rows
    if not own:
        return {"status": NOT_RUN}
    layers = sum(r["layers"] for r in own)
    elements = sum(r["elements"] for r in own)
    differing = sum(r["differing"] for r in own)
    sp = spacing.empty()
    for r in own:
        spacing.add(sp, r)
    return {"status": "run", "dtypes": sorted({r["dtype"] for r in own}), "layers": layers,
            "identical_layers": sum(r["identical_layers"] for r in own), "elements": elements,
            "differing": differing, "ppm": 1e6 * differing / elements if elements else None,
            "max_spacing": max(r["max_spacing"] for r in own),
            "max_spacing_significant": max(r["max_spacing_significant"] for r in own),
            **{k: sp[k] for k in NEAR_ZERO_KEYS}, "accumulators_equal": None,
            "lse_differing": sum(r["lse_differing"] for r in own), "lse_elements": sum(r["lse_elements"] for r in own),
            "lse_max_spacing": max(r["lse_max_spacing"] for r in own)}


def beyond_reference(replay: list[dict[str, Any]], key: tuple[str, str], column: str = "max_spacing") -> int | None:
    """The pair's largest replay distance beyond either kernel's own from float64 (module docstring);
    ``column`` ``max_spacing`` (raw) or ``max_spacing_significant`` (the normal range)."""
    pair = [r for r in _pair_rows(replay, key) if r["dtype"] == ACTIVATION_DTYPE]
    refs = {r["impl_a"]: r[column] for r in replay
            if r["comparison"] == "reference" and r["dtype"] == ACTIVATION_DTYPE}
    if not pair or key[0] not in refs or key[1] not in refs:
        return None
    return max(0, int(max(r[column] for r in pair)) - int(max(refs[key[0]], refs[key[1]])))


def per_dtype(replay: list[dict[str, Any]], key: tuple[str, str]) -> list[dict[str, Any]]:
    """Per dtype: the pair's replay figures and each kernel's distance from the float64 attention."""
    out = []
    for r in sorted(_pair_rows(replay, key), key=lambda x: x["dtype"]):
        refs = {x["impl_a"]: x for x in replay if x["comparison"] == "reference" and x["dtype"] == r["dtype"]}
        out.append({"dtype": r["dtype"], "layers": r["layers"], "identical_layers": r["identical_layers"],
                    "elements": r["elements"], "differing": r["differing"], "max_spacing": r["max_spacing"],
                    "max_spacing_significant": r["max_spacing_significant"],
                    **{k: r.get(k) for k in NEAR_ZERO_KEYS},
                    "lse_differing": r["lse_differing"], "lse_elements": r["lse_elements"],
                    "lse_max_spacing": r["lse_max_spacing"],
                    "reference_max_spacing": {k: refs[k]["max_spacing"] for k in key if k in refs},
                    "reference_max_spacing_significant": {k: refs[k]["max_spacing_significant"]
                                                          for k in key if k in refs}})
    return out


def answer_detail(section: dict[str, Any] | None, dtypes: list[dict[str, Any]],
                  algorithms: dict[str, str] | None = None) -> str:
    """What an attention pair's answer adds to a GEMM pair's (whose replay clause already gives the
    normal-range max and the near-zero outputs beyond it, reports/spacing.py): each kernel's own
    normal-range max distance from float64 -- the yardstick of the pair's --, and the logsumexp
    differences."""
    if section is None:
        return ""
    row = next((d for d in dtypes if d["dtype"] in section["dtypes"]), None)
    own = "" if row is None else ", ".join(
        f"{k} {v} sp" for k, v in row.get("reference_max_spacing_significant", row["reference_max_spacing"]).items())
    why = "; ".join(f"{k} within the bounds of {v}" for k, v in sorted((algorithms or {}).items()))
    return (f"; replay {'/'.join(section['dtypes'])}, each kernel vs float64 (normal range): {own or 'not run'}"
            + (f" (the verdict's reason: {why})" if why else "") + "; "
            f"logsumexp {section['lse_differing']}/{section['lse_elements']} differ "
            f"(max {section['lse_max_spacing']} fp32 sp)")


def bound_checks(replay: list[dict[str, Any]], key: tuple[str, str]) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Each kernel's ``{"bounds": verdict}`` from its reference rows judged against an algorithm (every
    dtype replayed): INCORRECT when an output or logsumexp element lies outside the bounds,
    WITHIN_ALGORITHM_BOUND otherwise, ``not run`` without an algorithm; and the algorithm per kernel."""
    checks: dict[str, dict[str, str]] = {}
    algorithms: dict[str, str] = {}
    for kernel in key:
        judged = [r for r in replay if r["comparison"] == "reference" and r["impl_a"] == kernel and r["algorithm"]]
        if not judged:
            checks[kernel] = {"bounds": NOT_RUN}
            continue
        outside = sum((r["outside_bound"] or 0) + (r["lse_outside_bound"] or 0) for r in judged)
        checks[kernel] = {"bounds": "INCORRECT" if outside else "WITHIN_ALGORITHM_BOUND"}
        algorithms[kernel] = ",".join(sorted({r["algorithm"] for r in judged}))
    return checks, algorithms
