"""What every experiment says about swapping one kernel for another: the matrix view of the certificates.

``report conformance`` is one row per (sweep, kernel pair, scale mode) of ``reports.certificate``:
the section's verdict and its numbers (K-depth ppm with its exact interval, max spacing raw and beyond
the reference's own error, the K-trend slope and interval, replay layers identical, sequences
identical), beside the certificate's one-line answer. The check verdicts (``check_verdicts``, the
worst verdict over trials and shapes, also a nightly metric) are defined in ``reports.certificate``
and re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reports.certificate import (
    VERDICT_ORDER,
    certificates,
    check_verdicts,
    matrix_rows,
    worst_verdict,
)

if TYPE_CHECKING:
    from storage.catalog import Catalog

__all__ = ["VERDICT_ORDER", "check_rows", "check_verdicts", "conformance", "worst_verdict"]


def check_rows(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    """Worst check verdict per (sweep, kernel, check, output format): the table people read."""
    return [{"sweep": r["sweep"], "kernel": r["kernel"], "check": r["check"], "output": r["dtype"],
             "verdict": r["verdict"]} for r in check_verdicts(cat, sweep)]


def conformance(cat: Catalog, sweep: str | None) -> list[dict[str, Any]]:
    """One row per (sweep, kernel pair, scale mode): the certificates' matrix (``matrix_rows``)."""
    return matrix_rows(certificates(cat, sweep))
