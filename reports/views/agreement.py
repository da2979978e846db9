"""``report agreement``: bitwise agreement of generated sequences."""

from __future__ import annotations

from typing import Any

from reports.registry import Block, Report, Section, View, lazy


def _build(cat: Any, sweep: str, opts: dict[str, Any]) -> View:
    from reports import agreement as ag

    rep = ag.agreement(cat, sweep)
    rows = {key: rep[ag.TABLE_KEYS[key]] for key in ag.TABLE_KEYS}
    blocks = [
        Block("self-reproducibility: sequences bit-identical across cold restarts",
              ag.self_table(rep["self_reproducibility"]), key="self"),
        Block("cross-arm agreement: restart-0 sequences bit-identical (positions 0-based)",
              ag.cross_table(rep["cross_arm"]), key="cross"),
        Block("distinct completions in N cold restarts, per arm and prompt",
              ag.distinct_table(rep["distinct_completions"]), key="distinct"),
        Block("first divergence per prompt (restart 0)", ag.divergence_table(rep["first_divergence"]), key="divergence"),
        Block("per-position agreement (restart 0)", ag.positions_table(rep["position_agreement"]), key="positions"),
    ]
    if opts["table"] == "all":
        blocks = [b for b in blocks if b.key in ("self", "cross", "distinct")]
    empty = not rep["self_reproducibility"] and not rep["cross_arm"]
    return View(sweep, rows, blocks, json=rep, empty="no generated sequences yet" if empty else None)


def _document(cat: Any, sweep: str) -> list[Section]:
    from reports import agreement as ag

    tabs = [{"title": t, "rows": rows, "note": ""} for t, rows in ag.summary_tables(cat, sweep)]
    return [Section("agreement", "End-to-end agreement",
                    "Greedy sequences compared across cold restarts and across arms.", tabs)] if tabs else []


REPORT = Report(
    name="agreement",
    order=50,
    question="Are the generated sequences bit-identical across cold restarts and across kernels?",
    query="cross_arm",
    tables=("self", "cross", "divergence", "positions", "distinct"),
    help="""Bitwise agreement of generated sequences: each arm with itself across cold restarts, and arm pairs.

`self`: per arm, the prompts whose generated sequence is bit-identical in every cold restart (k/N),
the worker processes of the restarts (fresh processes: distinct processes = restarts) and whether
the kernel-selection evidence matched the configured kernel. `cross`: per pair of arms of a sweep,
the prompts whose restart-0 sequences are identical (k/N), the arms' scales, and the first
generated position (0-based) where the others diverge (min / median / max; `divergence` lists
every prompt). `positions`: per generated position, the share of prompts whose tokens agree there
and whose sequences are still identical up to it. `distinct`: per arm, the distinct completions
its N cold restarts produced per prompt (max / mean, prompts with more than one, and how many
prompts had 1, 2, ... of them). JSON (`--table all`): one object with `self_reproducibility`,
`cross_arm` (each pair with `diverged`, `first_divergence`, `first_divergences`),
`first_divergence`, `position_agreement` and `distinct_completions`; another `--table` gives its rows.""",
    example="swapcheck report agreement --results results --sweep e2e-demo --format json",
    columns={"identical": "prompts (k/N)", "first_divergence": "generated position, 0-based"},
    build=_build,
    metrics=lazy("reports.metrics:generation_metrics"),
    document=_document,
)
