"""Activation-quantizer comparisons: the tables of ``report quantize``.

Every number comes from the named queries ``quantize_by_pair`` (one row per reference/candidate pair,
summed over every captured layer call) and ``quantize_by_layer`` (one row per layer call); the
meaning of each figure is in docs/quantizers.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The certificate's vocabulary and rare fraction (tasks/verdicts.py, mirrored there: reports import no tasks).
from reports.certificate import NOT_RUN, RARE_FRACTION

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["DOCUMENT_TITLE", "document_note", "by_layer", "by_pair", "document_table", "layer_table", "pair_table",
           "pair_verdict"]


def pair_verdict(r: dict[str, Any]) -> str:
    """The verdict of one ``quantize_by_pair`` row, in the certificate's vocabulary and by the rule a
    quantizer certificate applies to its downstream replay (docs/quantizers.md, "Verdict per pair"):
    ``IDENTICAL`` when the downstream GEMM outputs are bit-identical; ``EPILOGUE_ROUNDING`` when they
    differ in at most RARE_FRACTION of outputs by at most 1 spacing (raw: every output); ``DIFFERENT``
    otherwise. INT8 and FP8 pairs alike (an FP8 pair's downstream is an FP8 GEMM). A row without a
    downstream (an FP8 pair in results written before FP8 pairs had one): ``IDENTICAL`` when the
    quantized values and scales are, else ``not run`` (no downstream GEMM to judge)."""
    if r["out_elements"] is None:
        return "IDENTICAL" if not r["q_differing"] and not r["scales_differing"] else f"{NOT_RUN} (no downstream GEMM)"
    if not r["out_differing"]:
        return "IDENTICAL"
    if (r["out_frac_differing"] or 0.0) <= RARE_FRACTION and (r["out_max_spacing"] or 0) <= 1:
        return "EPILOGUE_ROUNDING"
    return "DIFFERENT"



def by_pair(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    return cat.named("quantize_by_pair", sweep=sweep)


def by_layer(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    return cat.named("quantize_by_layer", sweep=sweep)


def _ppm(frac: float | None) -> float | None:
    return None if frac is None else round(1e6 * frac, 3)


def _pct(frac: float | None) -> float | None:
    return None if frac is None else round(100 * frac, 4)


def pair_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per pair: values differing (count, %), max |dq|, scales differing, max scale spacing,
    and downstream through the fixed GEMM (outputs differing, ppm, max output spacing, identical layers)."""
    return [{"experiment": r["experiment"], "pair": f"{r['reference']} vs {r['candidate']}",
             "verdict": pair_verdict(r),
             "acts": r["activation_dtype"], "q": r["q_dtype"], "layers": r["layers"],
             "values": r["elements"], "q differ": r["q_differing"], "q %": _pct(r["q_frac_differing"]),
             "max |dq|": r["q_max_abs_diff"], "scales differ": f"{r['scales_differing']}/{r['tokens']}",
             "scale sp": r["scale_max_spacing"], "scale fmt": r["scale_format"], "gemm": r["gemm_kernel"],
             "out differ": r["out_differing"], "out ppm": _ppm(r["out_frac_differing"]),
             "out max sp (normal range)": r["out_max_spacing_significant"], "out max sp (raw)": r["out_max_spacing"],
             "identical layers": None if r["out_elements"] is None else f"{r['identical_out_layers']}/{r['layers']}"}
            for r in rows]


def layer_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per layer call and pair."""
    return [{"experiment": r["experiment"], "pair": f"{r['reference']} vs {r['candidate']}", "layer": r["layer"],
             "values": r["elements"],
             "q differ": r["q_differing"], "q %": _pct(r["q_frac_differing"]), "max |dq|": r["q_max_abs_diff"],
             "scales differ": f"{r['scales_differing']}/{r['tokens']}", "scale sp": r["scale_max_spacing"],
             "out differ": r["out_differing"], "out max sp": r["out_max_spacing"],
             "out identical": None if r["out_bitwise_equal"] is None else ("yes" if r["out_bitwise_equal"] else "no")}
            for r in rows]


#: The title of the per-pair table in ``report all`` (the "Quantizer swaps" section).
DOCUMENT_TITLE = "Quantizer swaps: per pair, summed over every captured layer call"


def document_note(rows: list[dict[str, Any]]) -> str:
    """The note under the per-pair table: what each column holds, and the fixed GEMM kernel(s)."""
    gemm = sorted({r["gemm_kernel"] for r in rows if r["out_elements"] is not None and r["q_dtype"] == "int8"})
    fp8 = sorted({r["gemm_kernel"] for r in rows if r["out_elements"] is not None and r["q_dtype"] == "fp8_e4m3"})
    legacy = any(r["out_elements"] is None for r in rows)
    return ("Verdict (downstream GEMM): IDENTICAL when the GEMM outputs are bit-identical, EPILOGUE_ROUNDING "
            "when at most 0.1% of them differ, by at most 1 spacing, DIFFERENT otherwise (the certificate's rule). "
            "Both quantizers see the same captured activations (rounded to the activation dtype shown). "
            "Quantized values differing: int8 or e4m3 values with q_ref != q_cand, of all values (percent). "
            "Largest abs(q_ref - q_cand): int8 steps (FP8: value). Per-token scales differing: of all tokens, "
            "and the largest distance between two scales in spacings of the scale format. Downstream, both "
            "sides go through the same GEMM kernel and weights"
            + (f" (INT8 pairs: {', '.join(gemm)}, the engine's int8 weights)" if gemm else "")
            + (f" (FP8 pairs: {', '.join(fp8)}, fp32 accumulation with the CUTLASS epilogue of vLLM's FP8 W8A8 "
               "kernel; the engine's weights dequantized in fp32 and requantized once to FP8 e4m3 with "
               "per-output-channel fp32 scales, the channel-wise layout vLLM's FP8 path takes)" if fp8 else "")
            + ": GEMM output elements differing, of all outputs (ppm); the largest distance between two "
            "outputs in bf16 spacings, over the normal range (outputs at least 5% of the layer's largest) and "
            "raw, over all outputs (near zero a spacing is tiny, so the raw one can be large); layer calls whose outputs are "
            "bit-identical, of all."
            + (" Empty downstream cells: FP8 rows written before FP8 pairs had a downstream GEMM ('not run' "
               "unless nothing differs)." if legacy else ""))


def _count(n: int | None) -> str:
    return "" if n is None else f"{n:,}"


def _ppm_text(frac: float) -> str:
    ppm = 1e6 * frac
    return f"{ppm:,.0f}" if ppm >= 1000 else f"{ppm:.3g}"


def document_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``quantize_by_pair`` rows as the per-pair table of ``report all``: each column named for
    exactly the figure it holds (:func:`document_note`); None where a figure was not computed. A
    ``sweep`` column leads when the rows come from more than one sweep."""
    many = len({r["sweep"] for r in rows}) > 1
    out = []
    for r in rows:
        down = r["out_elements"] is not None
        out.append({
            **({"sweep": r["sweep"]} if many else {}),
            "experiment": r["experiment"],
            "pair (reference vs candidate)": f"{r['reference']} vs {r['candidate']}",
            "verdict (downstream GEMM)": pair_verdict(r),
            "activations": r["activation_dtype"],
            "quantized values differing (%)": f"{_count(r['q_differing'])} of {_count(r['elements'])} "
            f"({100 * r['q_frac_differing']:.3g} %)" if r["elements"] else None,
            "largest abs(q_ref - q_cand)": r["q_max_abs_diff"],
            "per-token scales differing (largest distance, spacings)": f"{_count(r['scales_differing'])} of "
            f"{_count(r['tokens'])}" + ("" if r["scale_max_spacing"] is None
                                        else f" ({r['scale_max_spacing']:,} {r['scale_format']})"),
            "GEMM outputs differing (ppm)": f"{_count(r['out_differing'])} of {_count(r['out_elements'])} "
            f"({_ppm_text(r['out_frac_differing'])})" if down and r["out_elements"] else None,
            "largest output distance, bf16 spacings (normal range: outputs >= 5% of largest / raw: all)":
            f"{r['out_max_spacing_significant']:,} / {r['out_max_spacing']:,}" if down else None,
            "layer calls bit-identical": f"{r['identical_out_layers']} of {r['layers']}" if down else None,
        })
    return out
