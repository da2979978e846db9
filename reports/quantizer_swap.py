"""Quantizer swaps: the pieces of a quantizer pair's certificate that differ from a GEMM pair's.

A quantizer pair is two activation quantizers (tasks.quantizers registry entries with their
parameters) with the GEMM kernel fixed. A quantizer is named by :func:`identity`: its registry name,
followed by its parameters when it has any (``int8-static(rounding=away, static_scale=0.03125)``),
so two entries that differ only in parameters are told apart. Its evidence has the sections of a
GEMM pair's certificate (reports/certificate.py):

* ``replay`` from ``quantize_by_pair`` (the ``quantize`` kind): both quantizers on the same captured
  activations, each side's ``(q, scale)`` through the same GEMM kernel and weights; the rows of
  :data:`ACTIVATION_DTYPE` activations (what the W8A8 engine hands its quantizer; every dtype's when
  that one was not run). Its figures are the downstream ones: layer calls bit-identical, output
  elements differing, largest distance in output spacings. An FP8 pair's downstream is an FP8 GEMM
  (the ``quantize`` kind's ``fp8_gemm_kernel``, its row's ``gemm_kernel``) on the layer's weights
  requantized once to FP8 e4m3 per output channel, with the same figures and verdict rule; FP8 rows
  written before that existed have no downstream: their replay is not run, their quantization
  figures are listed;
* ``end_to_end`` from ``cross_arm`` and ``quantizer_arms``: arm pairs that ran the same GEMM kernel,
  the same attention kernel, under the same scales and differ only in their quantizer
  (:func:`arm_pairs`), with each arm's self-reproducibility and the teacher-forced flips of each
  pair read alone;
* ``kdepth`` is not run (a quantizer has no K axis).

An arm without a ``quantizer`` on the CPU engine runs the engine's own, which equals ``vllm-int8``
bit for bit (tests/test_quantizers.py), so it is named ``vllm-int8`` here; on another engine its
quantizer is unknown and the arm is in no quantizer pair.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["ACTIVATION_DTYPE", "ENGINE_DEFAULT", "NOT_RUN", "answer", "arm_pairs", "arm_quantizers", "fixed_phrase",
           "identity", "no_downstream", "pair_keys", "quantize_rows", "quantize_summary", "replay_section", "same_quantizer"]

#: The activations the W8A8 engine hands its quantizer (the ``quantize`` kind's ``activation_dtype``).
ACTIVATION_DTYPE = "fp32"
#: What the CPU engine's own quantizer is (an arm without ``quantizer``).
ENGINE_DEFAULT = "vllm-int8"
NOT_RUN = "not run"


def _value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def identity(quantizer: str, params: dict[str, Any] | str | None) -> str:
    """A quantizer's name in a certificate: the registry name, with its parameters (sorted) if any."""
    p = json.loads(params) if isinstance(params, str) else (params or {})
    return quantizer if not p else f"{quantizer}({', '.join(f'{k}={_value(v)}' for k, v in sorted(p.items()))})"


def _unordered(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


# -- the quantize kind ----------------------------------------------------------------------------

def quantize_rows(cat: Catalog, sweep: str) -> list[dict[str, Any]]:
    """``quantize_by_pair`` rows of one sweep, each with ``quantizer_a``/``quantizer_b``: the reference's
    and the candidate's :func:`identity` (their labels when the parameters were not recorded)."""
    out = []
    for r in cat.named("quantize_by_pair", sweep=sweep):
        qa = r["reference"] if r.get("reference_params") is None else identity(r["reference_quantizer"], r["reference_params"])
        qb = r["candidate"] if r.get("candidate_params") is None else identity(r["candidate_quantizer"], r["candidate_params"])
        out.append({**r, "quantizer_a": qa, "quantizer_b": qb})
    return out


def _pair_rows(rows: list[dict[str, Any]], key: tuple[str, str], gemm: str) -> list[dict[str, Any]]:
    return [r for r in rows if _unordered(r["quantizer_a"], r["quantizer_b"]) == key and r["gemm_kernel"] == gemm]


def replay_section(rows: list[dict[str, Any]], key: tuple[str, str], gemm: str) -> dict[str, Any]:
    """The ``replay`` section of a quantizer pair: the downstream figures of its ``quantize`` rows of
    :data:`ACTIVATION_DTYPE` activations (of every dtype run when that one was not), summed over every
    experiment, in the shape of a GEMM pair's replay section; not run when no row has a downstream."""
    mine = [r for r in _pair_rows(rows, key, gemm) if r["out_elements"] is not None]
    own = [r for r in mine if r["activation_dtype"] == ACTIVATION_DTYPE] or mine
    if not own:
        return {"status": NOT_RUN}
    elements = sum(r["out_elements"] for r in own)
    differing = sum(r["out_differing"] for r in own)
    return {"status": "run", "activation_dtypes": sorted({r["activation_dtype"] for r in own}),
            "experiments": sorted({r["experiment"] for r in own}), "gemm_kernel": gemm,
            "layers": sum(r["layers"] for r in own), "identical_layers": sum(r["identical_out_layers"] for r in own),
            "elements": elements, "differing": differing, "ppm": 1e6 * differing / elements if elements else None,
            "max_spacing": max(r["out_max_spacing"] for r in own),
            "max_spacing_significant": max(r["out_max_spacing_significant"] for r in own),
            "accumulators_equal": None,
            "q_elements": sum(r["elements"] for r in own), "q_differing": sum(r["q_differing"] for r in own),
            "tokens": sum(r["tokens"] for r in own), "scales_differing": sum(r["scales_differing"] for r in own)}


def quantize_summary(rows: list[dict[str, Any]], key: tuple[str, str], gemm: str) -> list[dict[str, Any]]:
    """Per experiment (activation dtype): the pair's quantization and downstream figures as
    ``quantize_by_pair`` sums them (the ``quantize`` section of the certificate)."""
    return [{"experiment": r["experiment"], "activation_dtype": r["activation_dtype"], "q_dtype": r["q_dtype"],
             "reference": r["quantizer_a"], "candidate": r["quantizer_b"], "layers": r["layers"],
             "elements": r["elements"], "q_differing": r["q_differing"], "q_max_abs_diff": r["q_max_abs_diff"],
             "tokens": r["tokens"], "scales_differing": r["scales_differing"],
             "scale_max_spacing": r["scale_max_spacing"], "scale_format": r["scale_format"],
             "out_elements": r["out_elements"], "out_differing": r["out_differing"],
             "out_max_spacing": r["out_max_spacing"], "out_max_spacing_significant": r["out_max_spacing_significant"],
             "identical_out_layers": r["identical_out_layers"] if r["out_elements"] is not None else None}
            for r in sorted(_pair_rows(rows, key, gemm), key=lambda x: (x["activation_dtype"], x["experiment"]))]


# -- end to end -----------------------------------------------------------------------------------

def arm_quantizers(cat: Catalog, sweep: str) -> dict[str, str | None]:
    """Each generate arm's quantizer :func:`identity` (``quantizer_arms``); None where it is unknown
    (an arm without one on an engine other than the CPU one)."""
    out: dict[str, str | None] = {}
    for r in cat.named("quantizer_arms", sweep=sweep):
        if r["quantizer"]:
            out[r["arm"]] = identity(r["quantizer"], r["quantizer_params"])
        else:
            out[r["arm"]] = ENGINE_DEFAULT if r["engine"] == "cpu" else None
    return out


def same_quantizer(c: dict[str, Any], quantizers: dict[str, str | None]) -> bool:
    """Whether the two arms of a ``cross_arm`` row ran the same quantizer (or neither is known)."""
    return quantizers.get(c["arm_a"]) == quantizers.get(c["arm_b"])


def arm_pairs(cross: list[dict[str, Any]], quantizers: dict[str, str | None]) -> list[dict[str, Any]]:
    """``cross_arm`` rows of arms that differ only in their quantizer (same GEMM kernel, same attention,
    same scales, both quantizers known), with ``kernel_a``/``kernel_b`` set to the quantizers and
    ``gemm_kernel`` to the fixed GEMM kernel."""
    out = []
    for c in cross:
        qa, qb = quantizers.get(c["arm_a"]), quantizers.get(c["arm_b"])
        if (c["same_scales"] and c["kernel_a"] and c["kernel_a"] == c["kernel_b"]
                and c.get("attention_a") == c.get("attention_b") and qa and qb and qa != qb):
            out.append({**c, "kernel_a": qa, "kernel_b": qb, "gemm_kernel": c["kernel_a"]})
    return out


def pair_keys(rows: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> dict[tuple[tuple[str, str], str], tuple[str, str]]:
    """Every (unordered quantizer pair, GEMM kernel) seen -> the order it was first named in
    (reference first for ``quantize`` rows)."""
    order: dict[tuple[tuple[str, str], str], tuple[str, str]] = {}
    for r in rows:
        order.setdefault((_unordered(r["quantizer_a"], r["quantizer_b"]), r["gemm_kernel"]), (r["quantizer_a"], r["quantizer_b"]))
    for c in pairs:
        order.setdefault((_unordered(c["kernel_a"], c["kernel_b"]), c["gemm_kernel"]), (c["kernel_a"], c["kernel_b"]))
    return order


# -- the answer -----------------------------------------------------------------------------------

#: The lead of a quantizer pair's answer, per verdict (the verdicts' rules are a GEMM pair's,
#: applied to the GEMM outputs downstream of the two quantizers: docs/certificate.md).
LEADS = {"IDENTICAL": "yes: bit-identical",
         "EPILOGUE_ROUNDING": "yes within 1 output spacing: GEMM outputs differ rarely (at most 0.1 %) and by at most one spacing",
         "WITHIN_ALGORITHM_BOUND": "yes within the accumulation algorithm's error bound",
         "DIFFERENT": "no, not bit for bit",
         "INCORRECT": "no: the GEMM kernel fails its correctness check",
         "PRECISION_DOWNGRADE": "no: the GEMM kernel computes in a narrower format than it claims",
         "ERROR": "no: the GEMM kernel raised in its check",
         "INCONCLUSIVE": "inconclusive: sequences differ end to end, no quantize experiment compared the two",
         NOT_RUN: "not run: no experiment took these two quantizers through a GEMM"}


def no_downstream(summary: list[dict[str, Any]]) -> list[str]:
    """The quantized dtypes of a pair whose ``quantize`` rows have no GEMM downstream (FP8 rows written
    before FP8 pairs had one); empty when some row went through the GEMM kernel or none ran."""
    if not summary or any(x["out_elements"] is not None for x in summary):
        return []
    return sorted({x["q_dtype"] for x in summary})


def fixed_phrase(gemm: str, summary: list[dict[str, Any]]) -> str:
    """What the certificate holds fixed, in words: the GEMM kernel, or that there is none downstream."""
    dtypes = no_downstream(summary)
    if dtypes:
        return (f"quantizer swap: no downstream GEMM for this pair ({'/'.join(dtypes)} values, results written "
                f"before FP8 pairs had a downstream GEMM): only the quantization is compared")
    if any(x["q_dtype"] == "fp8_e4m3" for x in summary):
        return (f"quantizer swap: FP8 GEMM kernel {gemm} fixed (the layer's weights requantized once to FP8 e4m3, "
                "per-output-channel scales), only the activation quantizer changes")
    return f"quantizer swap: GEMM kernel {gemm} fixed, only the activation quantizer changes"


def answer(cert: dict[str, Any]) -> str:
    """``can B replace A with GEMM kernel G fixed? <lead>: <figures>`` for a quantizer pair (``can B
    replace A? no downstream GEMM for this pair (fp8 values): ...`` when its values go through none)."""
    dtypes = no_downstream(cert.get("quantize", []))
    head = (f"can {cert['kernel_b']} replace {cert['kernel_a']}? no downstream GEMM for this pair "
            f"({'/'.join(dtypes)} values, results written before FP8 pairs had one): " if dtypes else
            f"can {cert['kernel_b']} replace {cert['kernel_a']} with GEMM kernel {cert['gemm_kernel']} fixed? ")
    clauses = []
    for s in cert["scale_modes"]:
        rp, e2e = s["replay"], s["end_to_end"]
        if rp["status"] == "run":
            clauses.append(f"{rp['q_differing']:,}/{rp['q_elements']:,} quantized values and "
                           f"{rp['scales_differing']:,}/{rp['tokens']:,} scales differ on "
                           f"{'/'.join(rp['activation_dtypes'])} activations; GEMM outputs "
                           f"{rp['ppm']:.3g} ppm differ (max {rp['max_spacing']} sp; {rp['max_spacing_significant']} sp "
                           f"among outputs >= 5% of the layer's largest), "
                           f"{rp['identical_layers']}/{rp['layers']} layer calls identical")
        if e2e["status"] == "run":
            clauses.append(", ".join(f"{p['arm_a']}~{p['arm_b']} {p['identical']}/{p['total']} sequences identical"
                                     + "".join(f", {f['flips']}/{f['positions']} teacher-forced flips" for f in p["flips"])
                                     for p in e2e["arm_pairs"]))
    shown = {d for s in cert["scale_modes"] if s["replay"]["status"] == "run" for d in s["replay"]["activation_dtypes"]}
    for x in cert.get("quantize", []):
        if x["out_elements"] is not None and x["activation_dtype"] not in shown:
            ppm = 1e6 * x["out_differing"] / x["out_elements"] if x["out_elements"] else 0.0
            clauses.append(f"on {x['activation_dtype']} activations ({x['experiment']}): {x['q_differing']:,}/"
                           f"{x['elements']:,} quantized values differ, GEMM outputs {ppm:.3g} ppm "
                           f"(max {x['out_max_spacing_significant']} sp among outputs >= 5% of the layer's largest)")
    if not clauses:
        q = [x for x in cert.get("quantize", []) if x["out_elements"] is None]
        clauses = [f"{x['q_differing']:,}/{x['elements']:,} quantized values ({x['q_dtype']}) and "
                   f"{x['scales_differing']:,}/{x['tokens']:,} scales differ on {x['activation_dtype']} activations"
                   for x in q]
    lead = str(LEADS.get(cert["verdict"], cert["verdict"]))
    if cert["verdict"] == "INCONCLUSIVE" and shown:
        lead = "inconclusive: sequences differ end to end, yet no captured activation quantized differently"
    return head + lead + (": " + "; ".join(clauses) if clauses else "")
