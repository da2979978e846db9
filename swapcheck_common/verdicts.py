"""The verdict vocabulary's names, shared by the layer that computes verdicts (``tasks.verdicts``, whose
``Verdict`` enum has exactly these members in this order) and the layer that reports them
(``reports.certificate``, ``reports.conformance``, ``reports.metrics``), which may not import tasks.

The meaning of each verdict is in tasks/verdicts.py and docs/checks.md; here only what both sides need
to agree on: the order of severity, which verdicts pass, which fail a kernel outright, and what "rare"
means.

The three-way arbiter (issue #41; docs/certificate.md, "The arbiter") has its own small set, kept apart
from the pair verdicts above: it says which side of a pair left the bound of the accumulation algorithm
its kernel declares, each side judged against the exact result.

=================== ==========================================================================
``both_inside``     both sides inside their declared bounds: what differs is order (accumulation or
                    epilogue), not a defect
``a_outside_bound`` side A has outputs outside its declared bound, side B none
``b_outside_bound`` side B has outputs outside its declared bound, side A none
``both_outside``    both sides have outputs outside their declared bounds
=================== ==========================================================================

Where a side's bound is unknown (no bound declared, not judged, not recorded) and the other side does
not settle it, the arbiter gives no verdict: ``undecided``, with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ARBITER_ORDER", "ARBITER_UNDECIDED", "FAILING", "PASSING", "RARE_FRACTION", "VERDICT_ORDER",
           "arbiter_verdict", "worst_name"]

#: Every verdict, from most to least benign: a run of many trials ends in the worst of its parts.
VERDICT_ORDER: tuple[str, ...] = ("IDENTICAL", "EPILOGUE_ROUNDING", "WITHIN_ALGORITHM_BOUND", "DIFFERENT",
                                  "INCORRECT", "PRECISION_DOWNGRADE", "INCONCLUSIVE", "ERROR")
#: The verdicts that pass.
PASSING: frozenset[str] = frozenset({"IDENTICAL", "EPILOGUE_ROUNDING", "WITHIN_ALGORITHM_BOUND"})
#: The check verdicts that fail a kernel: they decide a certificate alone.
FAILING: frozenset[str] = frozenset({"INCORRECT", "PRECISION_DOWNGRADE", "ERROR"})
#: Differences from the reference in at most this fraction of outputs count as "rare".  Measured
#: (docs/numerics.md): INT8 epilogue orders differ in a few parts per million of outputs; fp32
#: accumulation orders of FP8 products versus exact in 0.0004-0.013 %; torch's bf16 CPU matmul versus
#: the correctly rounded result in about 0.03 % at K = 1000.
RARE_FRACTION = 1e-3


#: The arbiter's verdicts, from most to least benign (``both_outside`` last: two sides out of bound).
ARBITER_ORDER: tuple[str, ...] = ("both_inside", "a_outside_bound", "b_outside_bound", "both_outside")
#: The arbiter's status where a side's bound is unknown: no verdict, a reason instead.
ARBITER_UNDECIDED = "undecided"


def arbiter_verdict(a_outside: bool | None, b_outside: bool | None) -> str | None:
    """The arbiter's verdict from each side's judgement (True: outputs outside its declared bound;
    False: every output inside; None: unknown); None where an unknown side leaves it open."""
    if a_outside is None or b_outside is None:
        return None
    return ARBITER_ORDER[int(a_outside) + 2 * int(b_outside)]


def worst_name(verdicts: Iterable[str]) -> str:
    """The most severe of several verdict names (an unknown name is worse than every known one);
    IDENTICAL for none."""
    rank = {v: i for i, v in enumerate(VERDICT_ORDER)}
    return max(verdicts, key=lambda v: rank.get(v, len(VERDICT_ORDER)), default="IDENTICAL")
