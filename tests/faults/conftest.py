"""The fault suite's own accounting: what each measured case cost (units lost, rows duplicated,
silent wrong answers), written where ``tools/fault_report.py`` tallies it.

A test that measures the outcome of a fault calls the ``fault_outcome`` fixture once with what it
counted (never with constants: each figure is computed from the tree the fault left behind). When the
environment names a log (``SWAPCHECK_FAULT_LOG``), each record is appended to it as one JSON line, so
records from every pytest-xdist worker end up in one file; without it the records go nowhere and the
tests run as usual.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest

LOG_ENV = "SWAPCHECK_FAULT_LOG"

Record = Callable[..., None]


@pytest.fixture
def fault_outcome(request: pytest.FixtureRequest) -> Record:
    """``fault_outcome(lost=N, duplicated=N, silent_wrong=N, detected=bool, **detail)``: one record
    per call, named by the test that made it."""

    def record(*, lost: int, duplicated: int, silent_wrong: int, **detail: Any) -> None:
        path = os.environ.get(LOG_ENV)
        if not path:
            return
        # The test's node id is the record's key: a test's own ``case`` detail never replaces it.
        line = json.dumps({**detail, "case": request.node.nodeid, "lost": int(lost), "duplicated": int(duplicated),
                           "silent_wrong": int(silent_wrong)}, sort_keys=True, default=str)
        # One write of one line with O_APPEND: lines from concurrent workers never interleave.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    return record
