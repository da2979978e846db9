"""``report replay``: per-layer operand replay through both kernels."""

from __future__ import annotations

from typing import Any

from reports.registry import Block, Option, Report, Section, View, lazy


def _build(cat: Any, sweep: str, opts: dict[str, Any]) -> View:
    from reports import replay as rp

    per_layer = rp.by_layer(cat, sweep)
    blocks = []
    if per_layer and opts["by"] in ("type", "both"):
        blocks.append(Block("replay by layer type", rp.type_table(rp.by_type(cat, sweep))))
    if per_layer and opts["by"] in ("layer", "both"):
        blocks.append(Block("replay by layer", rp.layer_table(per_layer)))
    return View(sweep, per_layer, blocks, empty=None if per_layer else "no replay results yet")


def _document(cat: Any, sweep: str) -> list[Section]:
    from reports.figures import replay_figures

    figs = replay_figures(cat, sweep)
    return [Section("replay", "Per-layer replay", "Each layer's captured activations replayed through both kernels.",
                    figures=figs)] if figs else []


REPORT = Report(
    name="replay",
    order=30,
    question="Which layers stay bit-identical when the kernel is swapped on identical operands?",
    query="replay_by_layer",
    help="""Per-layer operand replay: bitwise agreement of each kernel pair on identical captured operands.

Per layer type: how many layers are bit-identical, the differing fraction and the largest
distance in output spacings; per layer: the same plus the integer alibi (the int32 accumulators
of both kernels agree). `capture` rows check that the capture kernel reproduces the model's own
outputs from the saved operands. Each sweep is shown on its own (JSON and CSV rows carry `sweep`).""",
    example="swapcheck report replay --results results --format json",
    options=(Option("by", "type, layer or both (tables); JSON is always per layer.", "both", ("type", "layer", "both")),),
    columns={"elements": "outputs compared", "differing": "outputs not bit-identical",
             "max_spacing": "output spacings (ordered bit patterns)"},
    build=_build,
    metrics=lazy("reports.metrics:replay_metrics"),
    document=_document,
)
