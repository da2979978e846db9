"""`swapcheck query` under limits of its own (issue #36): a query had grown to 8 GB and answered SIGTERM
with a stack dump after 4 min 24 s. Now: a wall-time limit, a limit on the process's resident memory and
one on the result's size, each named with its variable (exit 2, nothing printed but the error); SIGTERM
stops the query at once with one line and exit 143. Each through the real CLI in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.catalog import QueryLimits, guarded
from storage.store import ResultStore
from tests.conftest import REPO
from tests.test_catalog import _populate

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
ENDLESS = "SELECT count(*) FROM range(100000000000) a, range(10) b"  # minutes of work, interruptible


@pytest.fixture
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    _populate(ResultStore(root))
    return root


def _query(results: Path, sql: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "query", sql, "--results", str(results)],
                          cwd=REPO, env={**ENV, **env}, capture_output=True, text=True, timeout=180)


def test_a_query_past_its_time_limit_is_interrupted_and_named(results: Path) -> None:
    done = _query(results, ENDLESS, SWAPCHECK_QUERY_TIMEOUT_S="1")
    assert done.returncode == 2, done.stderr
    assert "error: the query ran past its time limit of 1 s (SWAPCHECK_QUERY_TIMEOUT_S)" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_result_larger_than_its_limit_is_refused_before_it_is_converted(results: Path) -> None:
    done = _query(results, "SELECT repeat('x', 3000000) AS s FROM range(4)", SWAPCHECK_QUERY_RESULT_MB="2")
    assert done.returncode == 2, done.stderr
    assert "the result is larger than 2 MB (SWAPCHECK_QUERY_RESULT_MB)" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_query_past_the_memory_limit_is_interrupted_and_named(results: Path) -> None:
    # the process itself takes ~200 MB; the query's strings take ~1.5 GB more
    done = _query(results, "SELECT max(length(repeat('x', 1000000 + i))) FROM range(1500) t(i)",
                  SWAPCHECK_QUERY_MEMORY_MB="600", SWAPCHECK_DUCKDB_MEMORY="8GB")
    out = " ".join(done.stderr.split())
    assert done.returncode == 2 and "past its memory limit of 600 MB of resident memory" in out, done.stderr
    assert "(SWAPCHECK_QUERY_MEMORY_MB)" in out and "Traceback" not in done.stderr


def test_bad_limits_are_refused_naming_the_variable(results: Path) -> None:
    done = _query(results, "SELECT 1", SWAPCHECK_QUERY_MEMORY_MB="lots")
    assert done.returncode == 2 and "SWAPCHECK_QUERY_MEMORY_MB='lots': give megabytes" in done.stderr, done.stderr


def test_sigterm_stops_a_running_query_at_once_with_one_line(results: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "query", ENDLESS, "--results",
                             str(results)], cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    time.sleep(4)  # started, and running the query (it runs for minutes)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == ["error: SIGTERM: stopped."], err


def test_guarded_returns_what_the_work_returns_and_its_errors() -> None:
    import duckdb

    con = duckdb.connect(":memory:")
    assert guarded(con, lambda: con.sql("SELECT 41 + 1 AS a").fetchall(), QueryLimits()) == [(42,)]
    with pytest.raises(duckdb.Error):
        guarded(con, lambda: con.sql("SELECT * FROM nowhere").fetchall(), QueryLimits())
