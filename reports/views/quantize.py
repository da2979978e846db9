"""``report quantize``: two activation quantizers on the same captured activations."""

from __future__ import annotations

from typing import Any

from reports.registry import Block, Option, Report, Section, View


def _build(cat: Any, sweep: str, opts: dict[str, Any]) -> View:
    from reports import quantize as qr

    per_layer = [{**r, "verdict": qr.pair_verdict({**r, "out_frac_differing": (
        r["out_differing"] / r["out_elements"] if r["out_elements"] else None)})} for r in qr.by_layer(cat, sweep)]
    blocks = []
    if per_layer:
        blocks.append(Block("quantizer pairs (all layer calls)", qr.pair_table(qr.by_pair(cat, sweep))))
        if opts["layers"]:
            blocks.append(Block("quantizer pairs by layer call", qr.layer_table(per_layer)))
    return View(sweep, per_layer, blocks, empty=None if per_layer else "no quantize results yet")


def _document(cat: Any, sweep: str) -> list[Section]:
    from reports import quantize as qr
    from reports.render import not_run

    pairs = qr.by_pair(cat, sweep)
    return [Section("quantizer-swaps", "Quantizer swaps",
                    "Two activation quantizers on the same activations, the GEMM kernel fixed: how often the "
                    "quantized values and scales differ, and what the GEMM makes of it.",
                    [{"title": qr.DOCUMENT_TITLE, "rows": not_run(qr.document_table(pairs)),
                      "note": qr.document_note(pairs)}])] if pairs else []


REPORT = Report(
    name="quantize",
    order=70,
    question="How often do two activation quantizers disagree, and what does the GEMM make of it?",
    query="quantize_by_layer",
    help="""Quantizer swaps: how often two activation quantizers disagree, and what it does downstream.

Per (reference, candidate) pair, summed over every captured layer call of the `quantize` kind:
the quantized values that differ (count and percent of all values), the largest |q_ref - q_cand|
(int8 steps, or FP8 values), the per-token scales that differ and their largest distance in
spacings of the scale format, and downstream, with both sides fed through the SAME GEMM kernel
and weights: output elements that differ (count and parts per million), the largest distance in
output spacings, and how many layer calls stay bit-identical. Downstream columns are empty for
FP8 pairs. JSON and CSV: one object per layer call and pair (`quantize_by_layer`), each with the
`verdict` of that layer call by the same rule as the pair's (docs/quantizers.md).""",
    example="swapcheck report quantize --results results --sweep quantize-demo",
    options=(Option("layers", "Also one line per layer call and pair.", False),),
    build=_build,
    document=_document,
)
