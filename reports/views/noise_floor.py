"""``report noise-floor``: batch invariance of each kernel and the model's noise floor."""

from __future__ import annotations

from typing import Any

from reports.registry import Block, Report, Section, View

#: --table -> the key of reports.noise_floor.noise_floor() holding its rows (JSON and CSV).
KEYS = {"kernels": "kernels", "attention": "attention_kernels", "m": "by_m", "threads": "threads", "model": "model",
        "floor": "model_overall", "distinct": "distinct_completions"}


def _build(cat: Any, sweep: str, opts: dict[str, Any]) -> View:
    from reports import noise_floor as nf

    rep = nf.noise_floor(cat, sweep)
    table = opts["table"]
    views = [("kernels", "batch invariance per kernel (probe row in batches of M vs alone)", nf.kernel_table(rep["kernels"])),
             ("attention", "batch invariance per attention kernel (probe element in batches of B vs alone)",
              nf.attention_kernel_table(rep["attention_kernels"])),
             ("m", "kernels that vary: cells per batch size M", nf.m_table(rep["by_m"])),
             ("threads", "across torch thread counts: each cell vs the same cell at the unit's first count",
              nf.threads_table(rep["threads"])),
             ("floor", "model noise floor over every batch shape", nf.floor_table(rep["model_overall"])),
             ("model", "model noise floor per batch size", nf.model_table(rep["model"])),
             ("distinct", "distinct completions in N cold restarts, per arm", nf.distinct_table(rep["distinct_completions"]))]
    blocks = [Block(title, rows, key=key) for key, title, rows in views if table in ("all", key) and (rows or table == key)]
    blocks.append(Block(lines=[f"intervals: sequences — {rep['method']['sequences']}; positions — {rep['method']['positions']}"]))
    empty = not any(rep[k] for k in KEYS.values())
    return View(sweep, {k: rep[v] for k, v in KEYS.items()}, blocks, json=rep,
                empty="no batch_invariance or generate results yet" if empty else None)


def _document(cat: Any, sweep: str) -> list[Section]:
    from reports import noise_floor as nf

    tabs = [{"title": t["title"], "rows": t["rows"], "note": ""} for t in nf.document_tables(cat, sweep)]
    return [Section("noise-floor", "Batch invariance and the noise floor",
                    "What the same kernel changes by batch shape alone: each kernel's probe row in batches of M rows "
                    "vs the row alone, and the model's prompts in padded batches and decoded vs scored alone "
                    "(distinct completions per arm: End-to-end agreement).", tabs)] if tabs else []


REPORT = Report(
    name="noise-floor",
    order=110,
    question="What does the same kernel change by batch shape alone?",
    query="batch_invariance_kernels",
    tables=tuple(KEYS),
    help="""Batch invariance and the noise floor: what the same kernel changes by batch shape alone.

`kernels`: per kernel of a `batch_invariance` experiment (level kernel), output dtype and torch
thread count, its verdict against the accumulation algorithm the experiment declares (`algorithm`,
default `any`) — `bit-invariant` (the probe row bit-identical to the row computed alone, M = 1, at
every position of every batch size M and seed), `varies within bound (alg, fmt)` (rows differ, every
element of every computation within the algorithm's bound) or `varies beyond bound (alg, fmt)` —
with the cells bit-identical, the outputs differing, the largest distance in output spacings, the
largest |batch - alone| / bound width and the first M that varies (rows written before the bound:
`batch-invariant`, `varies within k spacings` or `varies beyond k spacings`, k the spec's
`tolerance_spacings`); `m`: per M, for the kernels that vary; `threads`: each cell vs the same cell
at the unit's first torch thread count (experiments with `threads`).
`attention`: the same verdicts per attention kernel (`attention_kernels`): a probe batch element's
causal attention, output and logsumexp, in batches of B elements vs alone.
`floor`: per kernel, scales, reductions and comparison (padded prefill, or KV-cache decode, vs the
prompt scored alone), the sequences whose argmax differs in some batch size, k/N with an exact
(Clopper-Pearson) 95% interval over prompts (k = 0: the exact one-sided upper bound); `model`: the
same per batch size, with positions (exact 95%, positions treated as independent), positions with
any logit differing, the largest logit distance in fp32 spacings and the largest margin at a flip.
`distinct`: per arm of a `generate` experiment, how many distinct greedy completions its N cold
restarts produced per prompt. JSON (`--table all`): one object with `kernels`, `attention_kernels`, `by_m`, `threads`, `model`,
`model_overall`, `distinct_completions` and `method`; another `--table` gives its rows. See
docs/noise-floor.md.""",
    example="swapcheck report noise-floor --results results --sweep noise-floor-demo",
    build=_build,
    document=_document,
)
