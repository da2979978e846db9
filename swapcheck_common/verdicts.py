"""The verdict vocabulary's names, shared by the layer that computes verdicts (``tasks.verdicts``, whose
``Verdict`` enum has exactly these members in this order) and the layer that reports them
(``reports.certificate``, ``reports.conformance``, ``reports.metrics``), which may not import tasks.

The meaning of each verdict is in tasks/verdicts.py and docs/checks.md; here only what both sides need
to agree on: the order of severity, which verdicts pass, which fail a kernel outright, and what "rare"
means.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["FAILING", "PASSING", "RARE_FRACTION", "VERDICT_ORDER", "worst_name"]

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


def worst_name(verdicts: Iterable[str]) -> str:
    """The most severe of several verdict names (an unknown name is worse than every known one);
    IDENTICAL for none."""
    rank = {v: i for i, v in enumerate(VERDICT_ORDER)}
    return max(verdicts, key=lambda v: rank.get(v, len(VERDICT_ORDER)), default="IDENTICAL")
