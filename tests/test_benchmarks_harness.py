"""The benchmark harness (benchmarks/common.py, run_all.py): how a ratio and its goal are judged, and
that a results file prints back as the summary and the Markdown table of docs/performance.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402


def test_cost_ratio_is_candidate_over_baseline_judged_on_the_least_disturbed_pair() -> None:
    c = common.Case("s", "c", "b", seconds=[3.0, 2.0, 8.0], baseline_seconds=[1.0, 1.0, 2.0], goal=2.5)
    assert c.pair_ratios() == [3.0, 2.0, 4.0]
    assert (c.ratio_min, c.ratio_median, c.judged, c.met) == (2.0, 3.0, 2.0, True)
    assert common.Case("s", "c", "b", [3.0], [1.0], goal=2.5).met is False
    assert common.Case("s", "c", "b", [3.0], [1.0], goal=None).met is None
    assert common.Case("s", "c", "b", [3.0, 2.0, 8.0], [1.0, 1.0, 2.0], goal=2.5, judge="median").met is False


def test_throughput_ratio_is_baseline_over_candidate_and_its_best_is_the_largest() -> None:
    c = common.Case("w", "c", "raw", seconds=[2.0, 1.25, 4.0], baseline_seconds=[1.0, 1.0, 1.0], goal=0.8,
                    direction=">=", throughput=True)
    assert c.pair_ratios() == [0.5, 0.8, 0.25]
    assert (c.ratio_min, c.ratio_median, c.met) == (0.8, 0.5, True)
    rec = c.record()
    assert rec["ratio_best"] == 0.8 and rec["repetitions"] == 3 and rec["met"] is True


def test_interleaved_alternates_candidate_and_baseline_after_the_warmup() -> None:
    calls: list[str] = []
    times = common.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeat=2, warmup=1)
    assert calls == ["a", "b"] * 3
    assert [len(v) for v in times.values()] == [2, 2]


@pytest.mark.parametrize("markdown", [False, True])
def test_show_prints_an_earlier_run_without_running_anything(tmp_path: Path, markdown: bool) -> None:
    met = common.Case("writer", "arrow table in", "raw pq.write_table", [1.0], [0.9], goal=0.8, direction=">=",
                      throughput=True)
    missed = common.Case("reads", "report kdepth", "hand-written DuckDB", [4.0], [1.0], goal=1.25)
    info = common.Case("reads", "catalog open", "duckdb.connect", [2.0], [1.0], goal=None)
    run = {"started_at": "2026-11-30T00:00:00+00:00", "quick": False, "seconds": 12.0,
           "machine": {"cpu": "test cpu", "cores": 2, "load_average": [0.5, 0.4, 0.3]},
           "stages": [{"stage": "writer", "load_before": [0.5, 0.4, 0.3], "cases": [met.record()]},
                      {"stage": "reads", "load_before": [1.0, 0.9, 0.8], "cases": [missed.record(), info.record()]}]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(run))
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run_all.py"), "--show", str(path),
                          *(["--markdown"] if markdown else [])], capture_output=True, text=True, timeout=60, check=True)
    assert "1 of 2 goals met" in out.stdout
    if markdown:
        assert "| writer | arrow table in | 0.90x | 0.90x | >= 0.8x | yes | raw pq.write_table | 0.5, 0.4, 0.3 |" in out.stdout
        assert "| reads | report kdepth | 4.00x | 4.00x | <= 1.25x | **no** |" in out.stdout
        assert "| reads | catalog open | 2.00x | 2.00x | - | - |" in out.stdout
        assert "load average before 0.5, 0.4, 0.3" in out.stdout
    else:
        assert "reads: report kdepth" in out.stdout and " NO " in out.stdout
