"""Batch invariance and the noise floor: what the same kernel changes by batch shape alone.

Rows of the ``batch_invariance`` kind (docs/noise-floor.md) turned into findings:

* each GEMM kernel's verdict (``batch_invariance_kernels``, one per output dtype and thread count)
  judged against the accumulation algorithm the experiment declares (``algorithm``, default
  ``any``): ``bit-invariant`` (every (seed, M, position) cell bit-identical to the probe row computed
  alone), ``varies within bound (alg, fmt)`` (cells differ, and every element of every computation
  of the probe, alone and in each batch, lies within the algorithm's bound) or ``varies beyond bound
  (alg, fmt)`` (some element outside it, or a NaN/Inf mismatch: no computation by that algorithm
  gives it); with the largest distance in output spacings and the largest |batch - alone| / bound
  width; the per-M detail (``batch_invariance_by_m``); the same cells across torch thread counts
  (``batch_invariance_threads``: each cell vs the same cell at the unit's first thread count).
  Rows written before the bound (no ``algorithm``) keep the spacings verdicts below;
* attention kernels and rows without a bound: ``batch-invariant``, ``varies within k spacings`` (no
  cell more than ``tolerance_spacings`` = k output spacings away and no NaN/Inf mismatch) or
  ``varies beyond k spacings``, for attention kernels (``batch_invariance_attention_kernels``: a probe batch element's causal
  attention, output and logsumexp, in batches of B elements vs alone);
* the model's noise floor per batch shape (``batch_invariance_model``) and over every batch shape of
  a comparison (``batch_invariance_model_prompts``): sequences (prompts) whose argmax differs from the
  prompt scored alone at some position, and positions whose argmax differs, each k/N with an exact
  (Clopper-Pearson) 95% interval from scipy (``reports.fliprisk.rate_interval``), its unit named;
  with k = 0 the exact one-sided upper bound instead; no interval without trials;
* the "distinct completions in N runs" of each arm of a ``generate`` experiment
  (``distinct_completions``): how many distinct greedy sequences N cold restarts produce per prompt.

The certificate (``reports.certificate``) puts :func:`certificate_section` beside each kernel pair's
end-to-end figures (a GEMM pair: the floors of its kernels; an attention pair: the floors measured
with either attention kernel and the arms' GEMM kernel; a quantizer pair: the floors of its fixed
GEMM kernel); ``reports.render`` adds :func:`document_tables` as a section;
``swapcheck report noise-floor`` prints :func:`noise_floor`'s tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reports.fliprisk import rate_interval

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["BATCH_INVARIANT", "BIT_INVARIANT", "VARIES_BEYOND", "VARIES_BEYOND_BOUND", "VARIES_WITHIN",
           "VARIES_WITHIN_BOUND", "attention_kernel_table", "threads_table", "certificate_section",
           "distinct_table", "document_tables", "evidence_cells", "floor_table", "interval", "kernel_table",
           "kernel_verdict", "m_table", "model_table", "noise_floor", "swap_phrases"]

BATCH_INVARIANT = "batch-invariant"
VARIES_WITHIN = "varies within {k} spacings"
VARIES_BEYOND = "varies beyond {k} spacings"
#: The verdicts of GEMM kernels judged against their declared algorithm's bound (issue #26).
BIT_INVARIANT = "bit-invariant"
VARIES_WITHIN_BOUND = "varies within bound ({algorithm}, {accumulate})"
VARIES_BEYOND_BOUND = "varies beyond bound ({algorithm}, {accumulate})"
NOT_RUN = "not run"
#: How a comparison of the model level reads.
COMPARISONS = {"padded_prefill": "padded prefill in a batch vs the prompt alone",
               "decode": "KV-cache decode in a batch vs prefill alone"}
#: The comparison and reductions that match a ``generate`` experiment's teacher-forced replay
#: (greedy decoding in a batch, scored alone by prefill; the engine's default fp64 reductions).
E2E_MATCH = ("decode", "fp64")


def _judged(r: dict[str, Any]) -> bool:
    """Whether every cell of a kernel line carries the bound columns (rows from before issue #26 do not)."""
    return bool(r.get("algorithm")) and r.get("cells_judged") == r["cells"]


def kernel_verdict(r: dict[str, Any]) -> str:
    """The verdict of one ``batch_invariance_kernels`` row (module docstring): against the declared
    algorithm's bound when every cell carries it, else in spacings."""
    if _judged(r):
        if r["cells_bitwise_equal"] == r["cells"]:
            return BIT_INVARIANT
        fmt = VARIES_BEYOND_BOUND if r["cells_beyond_bound"] else VARIES_WITHIN_BOUND
        return fmt.format(algorithm=r["algorithm"], accumulate=r["accumulate"])
    k = r["tolerance_spacings"]
    if r["cells_bitwise_equal"] == r["cells"]:
        return BATCH_INVARIANT
    if r["cells_beyond_tolerance"] == 0:
        return VARIES_WITHIN.format(k=k)
    return VARIES_BEYOND.format(k=k)


def _rate(k: int | None, n: int | None, unit: str) -> dict[str, Any]:
    k, n = int(k or 0), int(n or 0)
    info = rate_interval(k, n)
    return {"k": k, "n": n, "unit": unit, "rate": k / n if n else None, "method": info["method"],
            "level": info["level"], "interval": info["interval"], "upper_one_sided": info["upper_one_sided"]}


def interval(r: dict[str, Any], spec: str = ".3g") -> str:
    """``k/N [lo, hi]`` (exact 95%) or ``0/N (< hi one-sided)``; ``k/0`` has no interval."""
    head = f"{r['k']}/{r['n']}"
    if r["interval"] is None:
        return head
    if r["k"] == 0 and r["upper_one_sided"] is not None:
        return f"{head} (rate < {format(r['upper_one_sided'], spec)}, exact one-sided {r['level']:.0%})"
    lo, hi = r["interval"]
    return f"{head} [{format(lo, spec)}, {format(hi, spec)}] (exact {r['level']:.0%})"


def noise_floor(cat: Catalog, sweep: str | None) -> dict[str, Any]:
    """Everything of the noise floor of a sweep (or every sweep) as one JSON-able object."""
    kernels = [{**r, "verdict": kernel_verdict(r)} for r in cat.named("batch_invariance_kernels", sweep=sweep)]
    attention = [{**r, "verdict": kernel_verdict(r)}
                 for r in cat.named("batch_invariance_attention_kernels", sweep=sweep)]
    model = [{**r, "sequences": _rate(r["prompts_argmax_differ"], r["prompts"], "sequence"),
              "positions_rate": _rate(r["positions_argmax_differ"], r["positions"], "position")}
             for r in cat.named("batch_invariance_model", sweep=sweep)]
    overall = [{**r, "sequences": _rate(r["prompts_argmax_differ"], r["prompts"], "sequence")}
               for r in cat.named("batch_invariance_model_prompts", sweep=sweep)]
    return {"sweep": sweep, "kernels": kernels, "attention_kernels": attention,
            "by_m": cat.named("batch_invariance_by_m", sweep=sweep),
            "threads": cat.named("batch_invariance_threads", sweep=sweep),
            "model": model, "model_overall": overall,
            "distinct_completions": cat.named("distinct_completions", sweep=sweep),
            "method": {"sequences": "exact Clopper-Pearson 95% over prompts (scipy.stats.binomtest)",
                       "positions": "exact Clopper-Pearson 95% over positions, treated as independent "
                                    "(argmax differences cluster in sequences: too narrow then)"}}


# -- tables ---------------------------------------------------------------------------------------

def _sweep(rows: list[dict[str, Any]], r: dict[str, Any]) -> dict[str, Any]:
    return {"sweep": r["sweep"]} if len({x["sweep"] for x in rows}) > 1 else {}


def _bound_cells(r: dict[str, Any]) -> dict[str, Any]:
    """The bound columns of a kernel line ("not judged" for rows written before the bound)."""
    if not _judged(r):
        return {"bound (declared algorithm)": "not judged", "cells beyond bound": NOT_RUN,
                "max |batch - alone| / bound width": NOT_RUN, "alone row outside bound": NOT_RUN}
    return {"bound (declared algorithm)": f"{r['algorithm']} ({r['accumulate']})",
            "cells beyond bound": f"{r['cells_beyond_bound']}/{r['cells']}",
            "max |batch - alone| / bound width": f"{r['max_bound_ratio']:.3g}",
            "alone row outside bound": r["max_reference_outside_bound"]}


def _threads(r: dict[str, Any]) -> Any:
    return r["threads"] if r.get("threads") is not None else "(not recorded)"


def verdict_with_ratio(r: dict[str, Any]) -> str:
    """The verdict as a person reads it: "varies within bound" says little alone (at fp32 output an
    algorithm's bound can be tens of thousands of spacings wide, issue #36), so the largest
    |batch - alone| as a fraction of the bound's width goes beside it, with the largest distance in
    spacings. The JSON ``verdict`` stays the bare verdict; the ratio is ``max_bound_ratio``."""
    verdict = str(r["verdict"])
    if _judged(r) and r["cells_bitwise_equal"] != r["cells"]:
        return f"{verdict}: max |batch - alone| {r['max_bound_ratio']:.3g} of the bound width, {r['max_spacing']} spacings"
    return verdict


def kernel_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per kernel, output dtype and thread count: its verdict and the counts behind it."""
    return [{**_sweep(rows, r), "kernel": r["kernel"], "verdict": verdict_with_ratio(r),
             "operands": f"{r['dtype']} -> {r['out_dtype']}, {r['scale_mode']} scales",
             "K x N": f"{r['k']} x {r['n']}", "M": f"{r['min_m']}..{r['max_m']} ({r['batch_sizes']} sizes)",
             "threads": _threads(r), "cells bit-identical to M=1": f"{r['cells_bitwise_equal']}/{r['cells']}",
             "outputs differing": f"{r['differing']}/{r['elements']}",
             "max spacings": r["max_spacing"], **_bound_cells(r), "first varying M": r["first_varying_m"],
             "tolerance (spacings)": r["tolerance_spacings"]} for r in rows]


def threads_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per kernel, output dtype and thread count after a unit's first: its cells vs the same
    cells at the first thread count."""
    return [{**_sweep(rows, r), "kernel": r["kernel"], "operands": f"{r['dtype']} -> {r['out_dtype']}",
             "K x N": f"{r['k']} x {r['n']}", "threads vs first": f"{r['threads']} vs {r['first_threads']}",
             "cells differing": f"{r['cells_differing']}/{r['cells']}",
             "outputs differing": f"{r['differing']}/{r['elements']}", "max spacings": r["max_spacing"]}
            for r in rows]


def attention_kernel_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per attention kernel: its verdict and the counts behind it (output and logsumexp)."""
    return [{**_sweep(rows, r), "attention kernel": r["kernel"], "verdict": r["verdict"],
             "operands": f"{r['dtype']}, causal",
             "heads x seq_len x head_dim": f"{r['heads']} x {r['seq_len']} x {r['head_dim']}",
             "B": f"{r['min_batch']}..{r['max_batch']} ({r['batch_sizes']} sizes)",
             "cells bit-identical to B=1": f"{r['cells_bitwise_equal']}/{r['cells']}",
             "outputs differing": f"{r['differing']}/{r['elements']}", "max spacings": r["max_spacing"],
             "logsumexp differing (max fp32 spacings)": f"{r['lse_differing']} ({r['lse_max_spacing']})",
             "first varying B": r["first_varying_batch"],
             "tolerance (spacings)": r["tolerance_spacings"]} for r in rows]


def _attention(rows: list[dict[str, Any]], r: dict[str, Any]) -> dict[str, Any]:
    """The attention column, where some row of the table ran a named attention kernel."""
    return {"attention": r.get("attention") or "(its reductions')"} if any(x.get("attention") for x in rows) else {}


def m_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per kernel and M (only kernels with a cell that differs: the others are all 0)."""
    varying = {(r["sweep"], r["experiment"], r["kernel"]) for r in rows if r["cells_bitwise_equal"] != r["cells"]}
    return [{**_sweep(rows, r), "kernel": r["kernel"], "out": r["out_dtype"], "threads": _threads(r), "M": r["m"],
             "cells bit-identical": f"{r['cells_bitwise_equal']}/{r['cells']}",
             "outputs differing": f"{r['differing']}/{r['elements']}", "max spacings": r["max_spacing"],
             "cells beyond bound": r.get("cells_beyond_bound"),
             "max |batch - alone| / bound width": (None if r.get("max_bound_ratio") is None
                                                   else f"{r['max_bound_ratio']:.3g}")}
            for r in rows if (r["sweep"], r["experiment"], r["kernel"]) in varying]


#: The raw maximum of the model table, labelled for what it is (docs/noise-floor.md).
RAW_LOGIT_SPACING = "max fp32 spacings (raw, any logit; near zero a sign change alone is ~2^31)"
#: The distance in fp32 spacings from -1.0 to +1.0 (ordered bit patterns, +0 and -0 one apart): a
#: yardstick for raw distances that cross zero.
FP32_MINUS_ONE_TO_ONE = 2 * 0x3F800000 + 1


def raw_logit_cell(v: int | None) -> str:
    """A raw logit distance with its yardstick: ``"2,050,785,249 (0.96 x the distance from -1.0 to +1.0)"``
    (from 2^30 on: a distance that large between two same-sign logits needs a magnitude ratio of 2^128;
    across zero it is the sum of both sides' distances from zero)."""
    if v is None:
        return NOT_RUN
    if v < 2**30:
        return f"{v:,}"
    return f"{v:,} ({v / FP32_MINUS_ONE_TO_ONE:.2g} x the distance from -1.0 to +1.0)"


def model_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (kernel, scales, reductions, comparison, batch size)."""
    return [{**_sweep(rows, r), "kernel": r["kernel"], **_attention(rows, r), "scales": r["scales"],
             "reductions": r["reductions"], "comparison": r["comparison"], "batch": r["batch"],
             "sequences with an argmax difference": interval(r["sequences"]),
             "positions with an argmax difference": interval(r["positions_rate"]),
             "positions with any logit differing": f"{r['positions_logits_differ']}/{r['positions']}",
             "max fp32 spacings (normal range: logits >= 5% of the largest)": r["max_spacing_significant"],
             "max fp32 spacings at the argmax": r["max_argmax_spacing"],
             "positions whose max is at a near-zero logit": f"{r.get('positions_near_zero_max', 0) or 0}/{r['positions']}",
             RAW_LOGIT_SPACING: raw_logit_cell(r["max_spacing"]),
             "largest margin at a flip": r["max_flip_margin"]} for r in rows]


def floor_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (kernel, scales, reductions, comparison), over every batch size."""
    return [{**_sweep(rows, r), "kernel": r["kernel"], **_attention(rows, r), "scales": r["scales"],
             "reductions": r["reductions"], "comparison": COMPARISONS.get(r["comparison"], r["comparison"]),
             "batch sizes": ", ".join(map(str, r["batch_sizes"])),
             "sequences with an argmax difference in some batch": interval(r["sequences"]),
             "sequences with any logit differing": f"{r['prompts_logits_differ']}/{r['prompts']}"} for r in rows]


def distinct_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per arm: distinct greedy completions among its N cold restarts, per prompt."""
    return [{**_sweep(rows, r), "arm": r["arm"], "runs (N)": r["restarts"], "prompts": r["prompts"],
             "distinct completions per prompt (max / mean)": f"{r['max_distinct']} / {r['mean_distinct']:.3g}",
             "prompts with more than one": f"{r['prompts_several']}/{r['prompts']}",
             "prompts by distinct count": ", ".join(f"{d['distinct']}: {d['prompts']}" for d in r["distribution"])}
            for r in rows]


def document_tables(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    """``{title, rows}`` tables of the report's noise-floor section (empty when nothing of it ran)."""
    nf = noise_floor(cat, sweep)
    out = []
    if nf["kernels"]:
        out.append({"title": "Batch invariance per kernel (probe row vs the same row alone, M = 1)",
                    "rows": kernel_table(nf["kernels"])})
        varying = m_table(nf["by_m"])
        if varying:
            out.append({"title": "Kernels that vary: cells per batch size M", "rows": varying})
        if nf["threads"]:
            out.append({"title": "Across torch thread counts: each cell vs the same cell at the first count",
                        "rows": threads_table(nf["threads"])})
    if nf["attention_kernels"]:
        out.append({"title": "Batch invariance per attention kernel (probe element in batches of B vs alone)",
                    "rows": attention_kernel_table(nf["attention_kernels"])})
    if nf["model_overall"]:
        out.append({"title": "Model noise floor over every batch shape (exact 95% over prompts)",
                    "rows": floor_table(nf["model_overall"])})
        out.append({"title": "Model noise floor per batch size", "rows": model_table(nf["model"])})
    return out  # distinct completions: in the agreement section (reports.agreement.summary_tables)


# -- the certificate ------------------------------------------------------------------------------

def certificate_section(nf: dict[str, Any], sweep: str, kernels: tuple[str, str], *, swap: str = "gemm",
                        gemm: list[str] | None = None) -> dict[str, Any]:
    """The noise-floor figures of one certificate (kernels a, b), of this sweep only.

    ``swap = "gemm"``: each kernel's batch-invariance verdicts and the model noise floor rows of
    either kernel. ``"attention"`` (a, b attention kernels; ``gemm`` the arms' GEMM kernels): each
    attention kernel's verdicts and the model rows measured with either attention kernel (and one of
    those GEMM kernels). ``"quantizer"`` (``gemm`` the one fixed GEMM kernel): the verdicts and
    model rows of the fixed GEMM kernel: a quantizer has no floor of its own."""
    mine = [r for r in nf["model_overall"] if r["sweep"] == sweep]
    if swap == "attention":
        kern = [r for r in nf.get("attention_kernels", []) if r["sweep"] == sweep and r["kernel"] in kernels]
        model = [r for r in mine if r.get("attention") in kernels and (not gemm or r["kernel"] in gemm)]
    else:
        names = tuple(gemm or ()) if swap == "quantizer" else kernels
        kern = [r for r in nf["kernels"] if r["sweep"] == sweep and r["kernel"] in names]
        model = [r for r in mine if r["kernel"] in names]
    return {"swap": swap, "gemm_kernels": list(gemm or []), "kernels": kern, "model": model,
            "distinct_completions": [r for r in nf["distinct_completions"] if r["sweep"] == sweep]}


def _floor_phrase(r: dict[str, Any]) -> str:
    s = r["sequences"]
    att = f", attention {r['attention']}" if r.get("attention") else ""
    return (f"{r['kernel']}{att}, {r['reductions']} reductions, {COMPARISONS.get(r['comparison'], r['comparison'])} "
            f"(batches {', '.join(map(str, r['batch_sizes']))}): {s['k']}/{s['n']} sequences")


def swap_phrases(section: dict[str, Any] | None, scale_mode: str, pairs: list[dict[str, Any]]) -> list[str]:
    """"kernel swap a~b: 24/128 sequences differ; noise floor of the same kernel across batch shapes
    (...): 14/64 sequences" for each end-to-end arm pair of a scale mode. The floor of an attention
    pair is the one measured with either of its attention kernels; a quantizer pair's is "noise floor
    of the fixed GEMM kernel G across batch shapes"."""
    sec = section or {}
    rows = [r for r in sec.get("model", []) if r["scales"] == scale_mode]
    swap = sec.get("swap", "gemm")
    out = []
    for p in pairs:
        pair = (p["kernel_a"], p["kernel_b"])
        if swap == "quantizer":
            gemm = p.get("gemm_kernel") or "/".join(sec.get("gemm_kernels", []))
            head = (f"quantizer swap {p['arm_a']}~{p['arm_b']} ({p['kernel_a']} vs {p['kernel_b']}, GEMM kernel "
                    f"{gemm} fixed): {p['total'] - p['identical']}/{p['total']} sequences differ")
            mine = [r for r in rows if r["kernel"] == gemm]
            label = f"; noise floor of the fixed GEMM kernel {gemm} across batch shapes: "
        else:
            head = (f"kernel swap {p['arm_a']}~{p['arm_b']} ({p['kernel_a']} vs {p['kernel_b']}): "
                    f"{p['total'] - p['identical']}/{p['total']} sequences differ")
            key = "attention" if swap == "attention" else "kernel"
            mine = [r for r in rows if r.get(key) in pair
                    and (swap != "attention" or not p.get("gemm_kernel") or r["kernel"] == p["gemm_kernel"])]
            label = "; noise floor of the same kernel across batch shapes: "
        match = [r for r in mine if (r["comparison"], r["reductions"]) == E2E_MATCH] or mine
        floor = "; ".join(_floor_phrase(r) for r in match)
        out.append(head + (label + floor if floor else "; noise floor: not run"))
    return out


def _kernel_phrase(r: dict[str, Any]) -> str:
    if "min_batch" in r:  # an attention kernel: B batch elements
        return (f"{r['kernel']}: {r['verdict']} ({r['cells_bitwise_equal']}/{r['cells']} cells bit-identical, "
                f"B {r['min_batch']}..{r['max_batch']}, max {r['max_spacing']} sp, logsumexp max "
                f"{r['lse_max_spacing']} sp)")
    bound = f"max |batch - alone| {r['max_bound_ratio']:.3g} of the bound width; " if _judged(r) else ""
    where = f"{r['out_dtype']} out" + (f", {r['threads']} threads" if r.get("threads") is not None else "")
    return (f"{r['kernel']}: {r['verdict']} ({bound}{where}; {r['cells_bitwise_equal']}/{r['cells']} cells "
            f"bit-identical, M {r['min_m']}..{r['max_m']}, max {r['max_spacing']} sp)")


def evidence_cells(section: dict[str, Any] | None, scale_mode: str, pairs: list[dict[str, Any]]) -> dict[str, str]:
    """The certificate's evidence cells of one scale mode ("not run" where nothing measured it)."""
    sec = section or {}
    # attention kernels have no scale mode: their verdicts stand beside every section
    kern = [r for r in sec.get("kernels", []) if r.get("scale_mode", scale_mode) == scale_mode]
    model = [r for r in sec.get("model", []) if r["scales"] == scale_mode]
    arms = {a for p in pairs for a in (p["arm_a"], p["arm_b"])}
    distinct = [r for r in sec.get("distinct_completions", []) if r["arm"] in arms]
    return {
        "batch invariance (probe row in batches of M vs alone)": "; ".join(_kernel_phrase(r) for r in kern) or NOT_RUN,
        "model noise floor (sequences with an argmax difference across batch shapes)": "; ".join(
            _floor_phrase(r) for r in model) or NOT_RUN,
        "kernel swap vs noise floor": "; ".join(swap_phrases(sec, scale_mode, pairs)) if pairs and model else NOT_RUN,
        "distinct completions in N runs": "; ".join(
            f"{r['arm']}: max {r['max_distinct']} in {r['restarts']} runs ({r['prompts_several']}/{r['prompts']} "
            f"prompts with more than one)" for r in distinct) or NOT_RUN,
    }
