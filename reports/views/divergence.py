"""``report divergence``: where two arms part, and the figures the field reads (reports/divergence.py)."""

from __future__ import annotations

from typing import Any

from reports.registry import Block, Option, Report, ReportError, Section, View

TABLES = ("first", "survival", "margins", "tarr", "distribution", "buckets")


def _opts(opts: dict[str, Any]) -> dict[str, Any]:
    if opts["resamples"] < 100:
        raise ReportError(f"--resamples {opts['resamples']}: must be at least 100")
    if not opts["threshold"] > 0:
        raise ReportError(f"--threshold {opts['threshold']}: must be a number above 0")
    return {"gate_metric": opts["gate_metric"], "threshold": float(opts["threshold"]),
            "resamples": opts["resamples"], "seed": opts["seed"]}


def _build(cat: Any, sweep: str, opts: dict[str, Any]) -> View:
    from reports import divergence as dv
    from reports import divergence_tables as tb

    rep = dv.divergence(cat, sweep, **_opts(opts))
    tables = tb.tables(rep)
    blocks = [Block(title, rows, key=key, lines=lines) for key, title, rows, lines in tables]
    if opts["table"] == "all":
        blocks = [b for b in blocks if b.key != "survival"]
    rows = tb.machine_rows(rep)
    empty = not rep["first_divergence"] and not rep["total_agreement"]["arms"] and not rep["distribution"]
    return View(sweep, rows, blocks, json=rep, empty="no generated sequences yet" if empty else None)


def _document(cat: Any, sweep: str) -> list[Section]:
    from reports import divergence as dv
    from reports import divergence_tables as tb

    tabs = [{"title": title, "rows": rows, "note": "\n".join(lines)}
            for key, title, rows, lines in tb.tables(dv.divergence(cat, sweep)) if rows and key != "survival"]
    return [Section("divergence", "Where the arms part, and the field's statistics",
                    "First divergence of the restart-0 generations, total agreement over N cold restarts, "
                    "probs_diff / k3 / mismatch KL from teacher-forced replay, and flips by the reference "
                    "token's probability (docs/divergence.md).", tabs)] if tabs else []


REPORT = Report(
    name="divergence",
    order=55,
    question="Where do two arms' generations part, and what do probs_diff, k3 KL, mismatch KL and TARr@N say?",
    query="divergence_sequences",
    tables=TABLES,
    options=(Option("gate_metric", "The per-position mean the gate reads: kl (mismatch KL), k3 or probs_diff.", "kl",
                    ("kl", "k3", "probs_diff")),
             Option("threshold", "Gate threshold: passes when |mean| + 2 SE < this.", 0.015),
             Option("resamples", "Bootstrap resamples (reference sequences resampled).", 2000),
             Option("seed", "Bootstrap seed.", 0)),
    help="""Where two arms part and the statistics RL and reproducibility work reports, per arm pair (never pooled).

`first`: per pair of arms (restart-0 generations, the pairs `report agreement` forms), sequences
that diverge, the Kaplan-Meier quantiles of the first differing position (a sequence identical to
its end is right-censored there; scipy.stats.ecdf) and the diverged ones' positions. `survival`:
S(t) = share of sequences identical through token t, with its 95% Greenwood (log-log) interval.
`margins`: each arm's top-1/top-2 margin at the first divergence beside its margins where the two
sequences are still identical. `tarr`: TARr@N per arm (prompts whose N cold-restart completions
are identical) and per pair over all 2N runs, exact Clopper-Pearson intervals, distinct completions
per prompt (median, max) and in all; accuracy and TARa@N where answers are recorded.
`distribution`: per teacher-forced pair, probs_diff (mean and max |p_ref - p_arm| of the reference
token), k3 KL, mismatch KL (exact KL(ref || arm), per position and per sequence), each mean with a
95% percentile-bootstrap interval resampling reference sequences, and the gate |mean| + 2 SE <
threshold. `buckets`: flips / positions by the reference token's probability under the reference
arm, 0.1-0.9 called out, exact intervals. See docs/divergence.md.""",
    example="swapcheck report divergence --results results --sweep e2e-demo --table distribution",
    columns={"first_divergence": "generated position, 0-based", "kl": "nats", "probs_diff": "probability",
             "tarr": "prompts (k/N)"},
    build=_build,
    document=_document,
)
