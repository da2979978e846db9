"""One verdict vocabulary (issue #39): tasks compute verdicts, reports read them, and both take the names,
their order, what passes, what fails a kernel and "rare" from swapcheck_common.verdicts."""

from __future__ import annotations

import re
from pathlib import Path

from reports import certificate, conformance, metrics
from swapcheck_common import verdicts as vocab
from tasks import verdicts

REPO = Path(__file__).resolve().parents[1]


def test_the_enum_is_the_shared_vocabulary_in_order() -> None:
    assert tuple(v.value for v in verdicts.Verdict) == vocab.VERDICT_ORDER
    assert {v.value for v in verdicts.PASSING} == vocab.PASSING
    assert verdicts.RARE_FRACTION is vocab.RARE_FRACTION or verdicts.RARE_FRACTION == vocab.RARE_FRACTION
    assert vocab.FAILING <= set(vocab.VERDICT_ORDER) and not vocab.FAILING & vocab.PASSING


def test_reports_use_the_same_names() -> None:
    assert tuple(certificate.VERDICT_ORDER) == vocab.VERDICT_ORDER
    assert tuple(conformance.VERDICT_ORDER) == tuple(metrics.VERDICT_ORDER) == vocab.VERDICT_ORDER
    assert set(certificate.PASSING) == vocab.PASSING and set(certificate.FAILING) == vocab.FAILING
    assert certificate.RARE_FRACTION == vocab.RARE_FRACTION


def test_worst_agrees_on_both_sides() -> None:
    for names in (["IDENTICAL"], ["EPILOGUE_ROUNDING", "IDENTICAL"], ["ERROR", "INCORRECT", "DIFFERENT"],
                  ["WITHIN_ALGORITHM_BOUND", "PRECISION_DOWNGRADE", "INCONCLUSIVE"]):
        assert certificate.worst_verdict(names) == verdicts.worst(names).value == vocab.worst_name(names)
    assert vocab.worst_name(["IDENTICAL", "SOMETHING-NEW"]) == "SOMETHING-NEW"  # unknown: worse than any
    assert vocab.worst_name([]) == "IDENTICAL"


def test_the_sql_that_counts_failed_fuzz_trials_names_the_passing_verdicts() -> None:
    sql = (REPO / "storage" / "queries" / "fuzz_coverage.sql").read_text()
    m = re.search(r"verdict NOT IN \(([^)]*)\)", sql)
    assert m is not None
    assert {x.strip().strip("'") for x in m.group(1).split(",")} == vocab.PASSING
