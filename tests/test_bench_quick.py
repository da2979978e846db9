"""`make bench` end to end: run_all.py runs every benchmark script with the harness's common options
(--json, --threads, --smoke/--quick) and collects a results file with the thread count and the load
around each stage. A run of the harness, not a measurement: it checks that every script still runs,
not what it measures (issue #22: the attention bounds script once rejected the options).

The slow set runs ``run_all.py --smoke`` end to end, every stage in one run (the stages are run_all's
own list, so a new ``benchmarks/bench_*.py`` is picked up), and ``run_all.py --smoke --only growth``
(bench_growth.py: not a stage of a plain run); the default set
checks the stage list and ``--only`` selection, that goals are judged on the median of the pairs and
the summary says so, and that the reads stage's number-by-number check of a report against its
baseline flags a difference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import run_all  # noqa: E402

#: Every stage run_all.py runs, in its order (``bench_<stage>.py``).
STAGES = [p.stem.removeprefix("bench_") for p in run_all.scripts()]


def _run_all(tmp_path: Path, *opts: str, timeout: float) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], float]:
    out = tmp_path / "results.json"
    env = {**os.environ, "SWAPCHECK_BENCH_ROWS_DIR": str(tmp_path / "rows")}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run_all.py"), *opts, "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done, json.loads(out.read_text()), wall


def _check_run(done: subprocess.CompletedProcess[str], run: dict[str, Any], tier: str) -> None:
    assert run["tier"] == tier and run["threads"] == 1 and run["machine"]["threads"] == 1
    assert run["max_load"] > 0
    assert "threads 1" in done.stdout and f"load threshold {run['max_load']:g}" in done.stdout


def _check_stage(s: dict[str, Any], run: dict[str, Any]) -> None:
    name = s["stage"]
    assert s["returncode"] == 0, name
    assert s["cases"], f"{name}: no cases"
    assert s["threads"] == 1 and isinstance(s["comparable"], bool)
    assert len(s["load_before"]) == 3 and len(s["load_after"]) == 3
    assert s["cpu_seconds"] >= 0 and "own_load_after" in s and s["max_load"] == run["max_load"]
    for c in s["cases"]:
        assert c["threads"] == 1 and len(c["load_after"]) == 3
        assert c["comparable"] is s["comparable"] and c["why"] == s["why"]
        if not c["comparable"]:
            assert c["met"] is None and "met_as_measured" in c


def test_stages_are_run_alls_list() -> None:
    # The parametrization below is run_all's own list: every stage of ORDER, and the scripts outside it
    # (attention_bounds, issue #22), each once.
    assert set(run_all.ORDER) <= set(STAGES) and "attention_bounds" in STAGES
    assert len(STAGES) == len(set(STAGES))


def test_only_with_a_stage_name_selects_that_stage_alone() -> None:
    # --only matches substrings; a stage's exact name must pick that stage alone, or one
    # parametrized run below would run two stages (a "reads" beside a "reads_wide").
    stages = ["reads", "reads_wide", "writer"]
    assert [s for s in stages if run_all.selected(s, ["reads"], stages)] == ["reads"]
    assert [s for s in stages if run_all.selected(s, ["read"], stages)] == ["reads", "reads_wide"]
    assert [s for s in stages if run_all.selected(s, ["reads_wide", "wri"], stages)] == ["reads_wide", "writer"]
    assert [s for s in stages if run_all.selected(s, [], stages)] == stages


def test_growth_runs_only_when_named() -> None:
    # bench_growth.py takes tens of minutes: a plain run (and the parametrization below) leaves it out.
    assert "growth" not in STAGES and "growth" in run_all.OPTIONAL
    assert [p.stem for p in run_all.scripts(optional=True)][-1] == "bench_growth"


def test_every_goal_is_judged_on_the_median_and_the_summary_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    import common

    c = common.Case("reads", "r", "b", seconds=[3.0, 1.0, 8.0], baseline_seconds=[1.0, 1.0, 2.0], goal=2.5)
    assert (c.ratio_min, c.ratio_median, c.judged, c.met) == (1.0, 3.0, 3.0, False)  # one lucky pair is not enough
    run = {"threads": 1, "max_load": 1.5, "stages": [{"stage": "reads", "cases": [c.record()]}]}
    run_all._summary(run)
    assert "judged on the median" in capsys.readouterr().out
    old = {**c.record(), "judge": "min", "met": True}  # a results file written under the best-pair rule
    run_all._summary({**run, "stages": [{"stage": "reads", "cases": [old]}]})
    assert "judged on the best pair" in capsys.readouterr().out


def test_reads_check_compares_every_number_of_the_baseline(tmp_path: Path) -> None:
    import bench_reads

    report = {"pairs": [{"positions": 10, "flips": 2, "auc_ci": [0.81, 0.9], "model": {"slope": -1.5}, "extra": "x"}]}
    same = {"pairs": [{"positions": 10, "flips": 2, "auc_ci": [0.8, 0.9], "model": {"slope": -1.5000001}}]}
    assert bench_reads.compare(report, same) == []  # bootstrap interval and fit within their tolerances
    off = {"pairs": [{"positions": 10, "flips": 3, "model": {"slope": -1.5}, "auc": 0.9}]}
    assert bench_reads.compare(report, off) == [".pairs[0].flips: 3 in the baseline, 2 in the report",
                                                ".pairs[0].auc: missing in the report"]
    cand, base = tmp_path / "c.csv", tmp_path / "b.csv"
    cand.write_text("arm,n,m\nref,3,0.1\n")
    base.write_text("arm,n,m\nref,3,0.10000000000000001\n")
    assert bench_reads.check("query", cand, base) == (6, [])
    base.write_text("arm,n,m\nref,4,0.1\n")
    assert bench_reads.check("query", cand, base)[1] == ["query[0][1]: 4 in the baseline, 3 in the report"]


@pytest.mark.slow  # about a minute: two small finished sweeps and two small row trees
def test_run_all_runs_growth_when_named(tmp_path: Path) -> None:
    done, run, wall = _run_all(tmp_path, "--smoke", "--only", "growth", timeout=900)
    assert [s["stage"] for s in run["stages"]] == ["growth"]
    _check_stage(run["stages"][0], run)
    cases = run["stages"][0]["cases"]
    assert {c["case"].split(",")[0] for c in cases} >= {"plan", "skip", "relaunch", "report agreement", "query"}
    assert all(c["goal"] is None and "exponent" in c["extra"] for c in cases)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_run_all_smoke_runs_every_stage_end_to_end(tmp_path: Path) -> None:
    """Every stage of a plain ``run_all.py`` at the --smoke sizes in one run (about 2 minutes on 2
    cores; ``--quick``, ``make bench-quick``, is the same code at larger sizes: 8 minutes, not in CI),
    each stage recording its threads, load and cases."""
    done, run, wall = _run_all(tmp_path, "--smoke", timeout=1500)
    _check_run(done, run, "smoke")
    stages = {s["stage"]: s for s in run["stages"]}
    assert sorted(stages) == sorted(STAGES) and len(run["stages"]) == len(STAGES)
    for name in STAGES:
        _check_stage(stages[name], run)
    print(f"run_all.py --smoke took {wall:.1f} s (stages: "
          + ", ".join(f"{s['stage']} {s['seconds']} s" for s in run["stages"]) + ")")
