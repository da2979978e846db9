"""``report certificate``: one verdict per kernel pair, with its evidence as numbers."""

from __future__ import annotations

from typing import Any

from reports.registry import Block, Option, Report, ReportError, View


def _by_scale(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The evidence rows turned: one line per kind of evidence, one column per scale mode."""
    keys = [k for k in (rows[0] if rows else {}) if k != "scales"]
    return [{"evidence": k, **{str(r["scales"]): r[k] for r in rows}} for k in keys]


def _build(cat: Any, sweep: str, opts: dict[str, Any]) -> View:
    from reports import certificate as cf

    certs = cf.certificates(cat, sweep)
    pair = opts["pair"]
    if pair is not None:
        names = [p.strip() for p in pair.split(",")]
        if len(names) != 2 or not all(names) or names[0] == names[1]:
            raise ReportError(f"--pair {pair!r}: give two different kernels as A,B")
        certs = cf.select_pair(certs, names[0], names[1])
    blocks = [Block(rows=_by_scale(cf.evidence_rows(c)), heading=f"{c['sweep']}: {c['kernel_a']} vs {c['kernel_b']} — "
                    f"{c['verdict']}", lines=[c["answer"]], after=list(cf.detail_lines(c))) for c in certs]
    return View(sweep, cf.matrix_rows(certs), blocks, json=certs,
                empty=None if certs else "no kernel pairs in these results" + (f" for --pair {pair}" if pair else ""))


REPORT = Report(
    name="certificate",
    order=100,
    question="Can kernel A replace kernel B? One verdict per pair, with its evidence.",
    query="certificate_arms",
    help="""The swap certificate of every kernel pair a sweep ran (N x N), one set per sweep (never pooled).

Each certificate leads with a one-line answer and one verdict of the vocabulary, then per scale
mode: K-depth ppm with an exact 95% interval and per K, the K-trend (slope of log-rate on log-K
with its 95% interval), max spacing raw and beyond the reference's own error, replay layers
identical, sequences identical, each arm's self-reproducibility and the flips of each
teacher-forced arm pair with an exact interval; then each kernel's check verdicts and the
provenance. `--format json` gives a list of certificates with stable keys (docs/schema.md); csv
gives the matrix, one row per pair and scale mode. See docs/certificate.md.""",
    example="swapcheck report certificate --results results --sweep demo --pair int8-cutlass-order,int8-triton-order",
    options=(Option("pair", "Only this kernel pair, `A,B` (either order)."),),
    build=_build,
    document=lambda cat, sweep: [],  # the certificate is the verdict table that opens `report all`
)
