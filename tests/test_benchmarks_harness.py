"""The benchmark harness (benchmarks/common.py, run_all.py): how a ratio and its goal are judged, and
that a results file prints back as the summary and the Markdown table of docs/performance.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402


def test_cost_ratio_is_candidate_over_baseline_judged_on_the_median_pair() -> None:
    c = common.Case("s", "c", "b", seconds=[3.0, 2.0, 8.0], baseline_seconds=[1.0, 1.0, 2.0], goal=2.5)
    assert c.pair_ratios() == [3.0, 2.0, 4.0]
    assert (c.ratio_min, c.ratio_median, c.judged, c.met) == (2.0, 3.0, 3.0, False)
    assert common.Case("s", "c", "b", [3.0], [1.0], goal=2.5).met is False
    assert common.Case("s", "c", "b", [3.0], [1.0], goal=None).met is None
    assert common.Case("s", "c", "b", [3.0, 2.0, 8.0], [1.0, 1.0, 2.0], goal=2.5, judge="min").met is True


def test_throughput_ratio_is_baseline_over_candidate_and_its_best_is_the_largest() -> None:
    c = common.Case("w", "c", "raw", seconds=[2.0, 1.25, 4.0], baseline_seconds=[1.0, 1.0, 1.0], goal=0.8,
                    direction=">=", throughput=True)
    assert c.pair_ratios() == [0.5, 0.8, 0.25]
    assert (c.ratio_min, c.ratio_median, c.met) == (0.8, 0.5, False)  # judged on the median pair
    rec = c.record()
    assert rec["ratio_best"] == 0.8 and rec["repetitions"] == 3 and rec["met"] is False


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


def test_threads_option_defaults_to_one_and_is_applied_to_the_environment_and_torch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    ap = common.parser("x")
    assert ap.parse_args([]).threads == 1
    args = ap.parse_args(["--threads", "2", "--smoke"])
    assert (args.threads, common.tier(args), common.pick(args, 100, 10, 1)) == (2, "smoke", 1)
    assert common.pick(ap.parse_args(["--quick"]), 100, 10, 1) == 10
    assert common.pick(ap.parse_args(["--smoke"]), 100, 10) == 10  # no smoke size: the quick one
    assert common.pick(ap.parse_args([]), 100, 10, 1) == 100
    # apply_threads changes process-wide state: put every piece of it back afterwards
    for var in common.THREAD_ENV:
        monkeypatch.setenv(var, "1")  # records the variable's state before the test
    monkeypatch.setattr(common, "THREADS", None)
    numba, pa = sys.modules.get("numba"), sys.modules.get("pyarrow")
    saved = (torch.get_num_threads(), numba.get_num_threads() if numba else None, pa.cpu_count() if pa else None,
             {i["prefix"]: i["num_threads"] for i in threadpool_info()})
    try:
        done = common.apply_threads(2)
        assert done["threads"] == 2 and done["torch"] == 2 == torch.get_num_threads()
        expected = {v: "2" for v in common.THREAD_ENV if not (v == "NUMBA_NUM_THREADS" and numba)}
        assert {v: os.environ.get(v) for v in expected} == expected
        assert common.Case("s", "c", "b", [1.0], [1.0], goal=None).record()["threads"] == 2
    finally:
        torch.set_num_threads(saved[0])
        if numba:
            numba.set_num_threads(saved[1])
        if pa:
            pa.set_cpu_count(saved[2])
        threadpool_limits(limits=saved[3])
    with pytest.raises(ValueError):
        common.apply_threads(0)


def test_a_case_records_the_load_when_it_was_made_and_what_its_figures_are() -> None:
    rec = common.Case("s", "c", "b", [2.0], [1.0], goal=None).record()
    assert len(rec["load_after"]) == 3 and rec["quantity"] == "seconds"


def test_load_threshold_counts_only_load_that_is_not_this_runs_own() -> None:
    assert common.default_max_load(2) == 1.5 and common.default_max_load(8) == 6.0
    assert common.comparability([0.4, 0.1, 0.0], [1.2, 0.5, 0.2], 1.5) == (True, None)
    ok, why = common.comparability([3.2, 1.0, 0.5], [1.0, 1.0, 1.0], 1.5)
    assert not ok and why == "load before 3.20 > 1.5"
    # After a stage that kept two cores busy, a load of 2.9 is mostly the stage's own: comparable.
    assert common.comparability([0.8, 0.4, 0.2], [2.9, 1.2, 0.5], 1.5, own_before=0.3, own_after=1.9)[0]
    ok, why = common.comparability([0.8, 0.4, 0.2], [4.0, 1.2, 0.5], 1.5, own_before=0.3, own_after=1.9)
    assert not ok and why == "load after 2.10 (4.00 less 1.90 of this run's own) > 1.5"


def test_own_load_follows_the_kernels_one_minute_damping() -> None:
    assert common.own_load(0.0, 2.0, 0.0) == 0.0
    assert common.own_load(0.0, 1.0, 60.0) == pytest.approx(1 - math.exp(-1))
    assert common.own_load(1.0, 0.0, 60.0) == pytest.approx(math.exp(-1))  # decays while idle
    assert common.own_load(0.0, 1.5, 6000.0) == pytest.approx(1.5)


def _stage(name: str, load_before: list[float], load_after: list[float], *cases: common.Case,
           own: tuple[float, float] = (0.0, 0.0)) -> dict[str, object]:
    return {"stage": name, "load_before": load_before, "load_after": load_after, "own_load_before": own[0],
            "own_load_after": own[1], "cases": [c.record() for c in cases]}


def test_a_stage_above_the_load_threshold_is_marked_not_comparable() -> None:
    import run_all

    quiet = _stage("writer", [0.3, 0.2, 0.1], [0.9, 0.3, 0.1],
                   common.Case("writer", "w", "raw", [1.0], [0.9], goal=0.8, direction=">=", throughput=True))
    loaded = _stage("reads", [3.2, 2.0, 1.0], [1.0, 1.0, 1.0],
                    common.Case("reads", "kdepth", "duckdb", [4.0], [1.0], goal=1.25),
                    common.Case("reads", "info", "duckdb", [2.0], [1.0], goal=None))
    for s in (quiet, loaded):
        run_all.mark(s, 1.5)
    assert quiet["comparable"] is True and quiet["why"] is None
    c = quiet["cases"][0]  # type: ignore[index]
    assert (c["met"], c["comparable"], c["why"]) == (True, True, None) and "met_as_measured" not in c
    assert loaded["comparable"] is False and loaded["why"] == "load before 3.20 > 1.5"
    missed, info = loaded["cases"]  # type: ignore[misc]
    assert (missed["met"], missed["met_as_measured"], missed["comparable"]) == (None, False, False)
    assert (info["met"], info["met_as_measured"], info["comparable"]) == (None, None, False)


@pytest.mark.parametrize("markdown", [False, True])
def test_show_prints_not_comparable_instead_of_yes_or_no(tmp_path: Path, markdown: bool) -> None:
    import run_all

    met = common.Case("writer", "arrow table in", "raw pq.write_table", [1.0], [0.9], goal=0.8, direction=">=",
                      throughput=True)
    missed = common.Case("reads", "report kdepth", "hand-written DuckDB", [4.0], [1.0], goal=1.25)
    stages = [_stage("writer", [0.5, 0.4, 0.3], [0.6, 0.4, 0.3], met),
              _stage("reads", [3.2, 0.9, 0.8], [2.0, 1.0, 0.9], missed, own=(0.1, 0.2))]
    for s in stages:
        run_all.mark(s, 1.5)
    run = {"started_at": "2026-11-30T00:00:00+00:00", "tier": "default", "quick": False, "seconds": 12.0,
           "threads": 1, "max_load": 1.5, "machine": {"cpu": "test cpu", "cores": 2, "load_average": [0.5, 0.4, 0.3]},
           "stages": stages}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(run))
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run_all.py"), "--show", str(path),
                          *(["--markdown"] if markdown else [])], capture_output=True, text=True, timeout=60, check=True)
    assert "1 of 1 goals met; 1 not comparable (load)" in out.stdout
    why = "load before 3.10 (3.20 less 0.10 of this run's own) > 1.5; load after 1.80 (2.00 less 0.20 of this run's own) > 1.5"
    if markdown:
        assert "| reads | report kdepth | 4.00x | 4.00x | <= 1.25x | not comparable |" in out.stdout
        assert "| writer | arrow table in | 0.90x | 0.90x | >= 0.8x | yes |" in out.stdout
        assert "1 thread, load threshold 1.5" in out.stdout
        assert f"Not comparable: reads ({why})." in out.stdout
    else:
        assert "reads: report kdepth" in out.stdout and "not comparable" in out.stdout and " NO " not in out.stdout
        assert f"not comparable: reads: {why}" in out.stdout
        assert "(threads 1, load threshold 1.5)" in out.stdout


def test_every_bench_script_accepts_the_harness_options() -> None:
    """run_all passes --json, --threads and --quick/--smoke to every script: each parser must know them."""
    for script in sorted((REPO / "benchmarks").glob("bench_*.py")):
        text = script.read_text()
        assert "parser(" in text and "apply_threads(" in text, script.name
        assert "argparse.ArgumentParser(" not in text, f"{script.name}: build the parser with common.parser"


def test_others_load_counts_every_thread_but_ours_and_our_descendants() -> None:
    """A busy child of ours is ours; a busy process outside our tree is the others'."""
    import os
    import subprocess
    import sys
    import time

    busy = [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 20: pass"]
    child = subprocess.Popen(busy)
    try:
        time.sleep(0.3)
        ours, every = common.running_tasks(os.getpid())
        assert ours >= 1 and every >= ours  # the spinning child (and this thread)
        # seen from the child's own tree, this process is not the child's
        theirs, _ = common.running_tasks(child.pid)
        assert theirs == 1
    finally:
        child.kill()
        child.wait()


def test_others_load_damps_like_the_kernel_and_keeps_its_peak() -> None:
    load = common.OthersLoad(interval=3600)  # not started: folded by hand
    load.value = load.peak = 2.0
    load._at = 0.0
    # 60 s later, 3 other tasks running: 2 e^-1 + 3 (1 - e^-1), the kernel's update with dt = 60 s
    assert load.fold(3, 60.0) == pytest.approx(2 * math.exp(-1) + 3 * (1 - math.exp(-1)))
    assert load.peak == pytest.approx(load.value) and load.samples == 1
    # then 5 s with none: it decays, the peak stays
    low = load.fold(0, 65.0)
    assert low == pytest.approx(load.peak * math.exp(-5 / 60)) and load.peak > low
    load.reset_peak()
    assert load.peak == low


def test_a_stage_whose_others_load_peaked_during_it_is_not_comparable() -> None:
    ok, why = common.comparability([0.2, 0.1, 0.0], [0.3, 0.1, 0.0], 1.5, others_peak=2.4)
    assert not ok and "peaked at 2.40 during the stage" in why
    assert common.comparability([0.2, 0.1, 0.0], [0.3, 0.1, 0.0], 1.5, others_peak=1.2) == (True, None)
