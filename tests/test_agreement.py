"""Agreement tables (named SQL over sequences, generations, arm_runs) and `report agreement`, on a
hand-built results tree whose every number is known.

Sweep `s1`, arms cutlass and triton (real scales), restarts 0 and 1, 6 prompts of 8 tokens:
- cutlass: both restarts identical (6/6), pids 101 and 102 on host h1;
- triton: restart 1 differs from restart 0 on prompt 5 at position 7 (5/6); both restarts ran as
  pid 201, on hosts h1 and h2 (one distinct pid, two distinct processes);
- triton restart 0 vs cutlass restart 0: prompt 1 diverges at position 2 and stays different, prompt 3
  differs at position 5 only (4/6 identical).
Sweep `s2`, arms a-pow2 and b-pow2 (pow2 scales): everything identical (6/6, no divergence).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from storage.catalog import run_named
from storage.store import ResultStore

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed

PROMPTS, LENGTH = 6, 8


def _sha(tokens: list[int]) -> str:
    return hashlib.sha256(b"".join(t.to_bytes(8, "little", signed=True) for t in tokens)).hexdigest()


def _base(p: int) -> list[int]:
    return [100 * p + i for i in range(LENGTH)]


def _tokens(sweep: str, arm: str, restart: int, p: int) -> list[int]:
    t = _base(p)
    if sweep == "s1" and arm == "triton":
        if p == 1:
            t = [x + 1000 if i >= 2 else x for i, x in enumerate(t)]
        if p == 3:
            t[5] += 1000
        if p == 5 and restart == 1:
            t[7] += 2000
    return t


def _margin(arm: str, i: int) -> float:
    return (1.0 if arm in ("cutlass", "a-pow2") else 2.0) + 0.25 * i


def write_generate_fixture(root: Path) -> None:
    """Write generations, sequences and arm_runs for sweeps s1 and s2 as the generate task would."""
    store = ResultStore(root)
    layout = {"s1": {"cutlass": ("real", "int8-cutlass-order", [("h1", 101), ("h1", 102)]),
                     "triton": ("real", "int8-triton-order", [("h1", 201), ("h2", 201)])},
              "s2": {"a-pow2": ("pow2", "int8-cutlass-order", [("h1", 301), ("h1", 302)]),
                     "b-pow2": ("pow2", "int8-triton-order", [("h1", 401), ("h1", 402)])}}
    for sweep, arms in layout.items():
        for arm, (scales, kernel, procs) in arms.items():
            for restart, (host, pid) in enumerate(procs):
                unit = f"{sweep}-{arm}-{restart}"
                gens, seqs = [], []
                for p in range(PROMPTS):
                    toks = _tokens(sweep, arm, restart, p)
                    for i, tok in enumerate(toks):
                        gens.append({"unit_id": unit, "experiment": "e2e", "arm": arm, "restart": restart,
                                     "prompt_index": p, "position": i, "token": tok, "margin": _margin(arm, i),
                                     "topk_ids": [tok, tok + 1], "topk_logits": [5.0, 5.0 - _margin(arm, i)]})
                    seqs.append({"unit_id": unit, "experiment": "e2e", "arm": arm, "restart": restart,
                                 "prompt_index": p, "prompt_hash": _sha([p, 7, 7]), "sequence_hash": _sha(toks),
                                 "n_tokens": len(toks), "tokens": toks})
                store.write("generations", sweep, unit, gens)
                store.write("sequences", sweep, unit, seqs)
                store.write("arm_runs", sweep, unit, [{
                    "unit_id": unit, "experiment": "e2e", "arm": arm, "restart": restart, "model": "tiny-qwen3",
                    "engine": "cpu-w8a8", "configured_kernel": kernel, "scales": scales, "env_json": "{}",
                    "host": host, "pid": pid, "observed_kernels": [kernel], "kernel_calls_json": "{}",
                    "evidence_ok": True, "weights_sha256": "w"}])


@pytest.fixture
def results(tmp_path: Path) -> Path:
    write_generate_fixture(tmp_path / "results")
    return tmp_path / "results"


def test_self_reproducibility(results: Path) -> None:
    rows = {(r["sweep"], r["arm"]): r for r in run_named(results, "self_reproducibility", sweep=None).to_pylist()}
    assert set(rows) == {("s1", "cutlass"), ("s1", "triton"), ("s2", "a-pow2"), ("s2", "b-pow2")}
    c, t = rows["s1", "cutlass"], rows["s1", "triton"]
    assert (c["identical"], c["total"], c["restarts"], c["nonidentical_prompts"]) == (6, 6, 2, [])
    assert (c["distinct_pids"], c["distinct_processes"], c["pids"], c["runs"]) == (2, 2, [101, 102], 2)
    assert (t["identical"], t["total"], t["nonidentical_prompts"]) == (5, 6, [5])
    assert (t["distinct_pids"], t["distinct_processes"], t["hosts"]) == (1, 2, ["h1", "h2"])
    assert t["processes"] == ["h1:201", "h2:201"]
    assert c["scales"] == "real" and c["configured_kernel"] == "int8-cutlass-order"
    assert c["evidence_ok"] is True and c["observed_kernels"] == ["int8-cutlass-order"]
    assert rows["s2", "a-pow2"]["identical"] == 6 and rows["s2", "b-pow2"]["scales"] == "pow2"


def test_self_reproducibility_needs_two_restarts(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.write("sequences", "s", "u", [{"unit_id": "u", "experiment": "e", "arm": "a", "restart": 0,
                                        "prompt_index": 0, "prompt_hash": "p", "sequence_hash": "h",
                                        "n_tokens": 1, "tokens": [1]}])
    (row,) = run_named(tmp_path, "self_reproducibility", sweep=None).to_pylist()
    assert row["identical"] is None and row["total"] == 1 and row["restarts"] == 1
    assert row["pids"] is None  # no arm_runs rows: nothing made up


def test_cross_arm(results: Path) -> None:
    rows = run_named(results, "cross_arm", sweep=None).to_pylist()
    assert [(r["sweep"], r["arm_a"], r["arm_b"]) for r in rows] == [("s1", "cutlass", "triton"), ("s2", "a-pow2", "b-pow2")]
    s1, s2 = rows
    assert (s1["identical"], s1["total"], s1["differing_prompts"]) == (4, 6, [1, 3])
    assert (s1["scales_a"], s1["scales_b"], s1["same_scales"]) == ("real", "real", True)
    assert (s1["prompt_mismatch"], s1["missing"]) == (0, 0)
    assert (s2["identical"], s2["total"], s2["differing_prompts"], s2["scales_a"]) == (6, 6, [], "pow2")
    only_s2 = run_named(results, "cross_arm", sweep="s2").to_pylist()
    assert [(r["arm_a"], r["identical"]) for r in only_s2] == [("a-pow2", 6)]


def test_cross_arm_counts_missing_and_mismatched_prompts(results: Path) -> None:
    # triton generates a 7th prompt that cutlass lacks; cutlass's prompt 0 came from another prompt
    store = ResultStore(results)
    store.write("sequences", "s1", "extra", [
        {"unit_id": "extra", "experiment": "e2e", "arm": "triton", "restart": 0, "prompt_index": 6,
         "prompt_hash": "p6", "sequence_hash": "h6", "n_tokens": 1, "tokens": [1]}])
    t = ResultStore(results).partition("sequences", "s1") / "s1-cutlass-0.parquet"
    import pyarrow.parquet as pq

    rows = pq.read_table(t).to_pylist()
    rows[0]["prompt_hash"] = "another prompt"
    store.write("sequences", "s1", "s1-cutlass-0", rows)
    (s1,) = run_named(results, "cross_arm", sweep="s1").to_pylist()
    assert (s1["identical"], s1["total"], s1["missing"], s1["prompt_mismatch"]) == (3, 7, 1, 1)
    assert s1["differing_prompts"] == [0, 1, 3, 6]


def test_first_divergence(results: Path) -> None:
    rows = run_named(results, "first_divergence", sweep="s1").to_pylist()
    assert [r["prompt_index"] for r in rows] == list(range(PROMPTS))
    first = {r["prompt_index"]: r["first_divergence"] for r in rows}
    assert first == {0: None, 1: 2, 2: None, 3: 5, 4: None, 5: None}
    r1 = rows[1]
    assert (r1["token_a"], r1["token_b"], r1["margin_a"], r1["margin_b"], r1["positions"]) == (102, 1102, 1.5, 2.5, LENGTH)
    assert all(r["token_a"] is None for r in rows if r["first_divergence"] is None)
    assert all(r["first_divergence"] is None for r in run_named(results, "first_divergence", sweep="s2").to_pylist())


def test_first_divergence_when_one_arm_is_shorter(results: Path) -> None:
    store = ResultStore(results)
    rows = [{"unit_id": "short", "experiment": "e2e", "arm": "triton", "restart": 0, "prompt_index": 9,
             "position": i, "token": 900 + i, "margin": 1.0, "topk_ids": [], "topk_logits": []} for i in range(3)]
    store.write("generations", "s1", "short", rows)
    store.write("generations", "s1", "short-c", [{**r, "unit_id": "short-c", "arm": "cutlass"} for r in rows[:2]])
    (r9,) = [r for r in run_named(results, "first_divergence", sweep="s1").to_pylist() if r["prompt_index"] == 9]
    assert (r9["first_divergence"], r9["positions"], r9["token_a"], r9["token_b"]) == (2, 3, None, 902)


def test_position_agreement(results: Path) -> None:
    rows = run_named(results, "position_agreement", sweep="s1").to_pylist()
    assert [r["position"] for r in rows] == list(range(LENGTH))
    for r in rows:
        p = r["position"]
        agreeing = PROMPTS - (p >= 2) - (p == 5)
        prefix = PROMPTS - (p >= 2) - (p >= 5)
        assert (r["prompts"], r["agreeing"], r["identical_prefix"]) == (PROMPTS, agreeing, prefix), p
        assert r["agreement"] == pytest.approx(agreeing / PROMPTS)
        assert r["prefix_agreement"] == pytest.approx(prefix / PROMPTS)
    s2 = run_named(results, "position_agreement", sweep="s2").to_pylist()
    assert {r["agreement"] for r in s2} == {1.0}


def test_empty_results_give_empty_tables(tmp_path: Path) -> None:
    for name in ("self_reproducibility", "cross_arm", "first_divergence", "position_agreement"):
        assert run_named(tmp_path, name, sweep=None).num_rows == 0


def test_report_agreement_json(results: Path) -> None:
    res = runner.invoke(app, ["report", "agreement", "--results", str(results), "--format", "json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert {"self_reproducibility", "cross_arm", "position_agreement", "first_divergence"} <= set(rep)
    selfr = {(r["sweep"], r["arm"]): r for r in rep["self_reproducibility"]}
    assert (selfr["s1", "triton"]["identical"], selfr["s1", "triton"]["total"]) == (5, 6)
    assert selfr["s1", "cutlass"]["pids"] == [101, 102]
    cross = {(r["sweep"], r["arm_a"], r["arm_b"]): r for r in rep["cross_arm"]}
    c = cross["s1", "cutlass", "triton"]
    assert (c["identical"], c["total"], c["diverged"]) == (4, 6, 2)
    assert c["first_divergence"] == {"min": 2, "median": 3.5, "max": 5}
    assert [(d["prompt_index"], d["first_divergence"]) for d in c["first_divergences"]] == [(1, 2), (3, 5)]
    p2 = cross["s2", "a-pow2", "b-pow2"]
    assert (p2["identical"], p2["total"], p2["diverged"], p2["first_divergence"]) == (6, 6, 0, None)


def test_report_agreement_sweep_filter_tables_and_csv(results: Path) -> None:
    res = runner.invoke(app, ["report", "agreement", "--results", str(results), "--sweep", "s2", "--format", "json"])
    rep = json.loads(res.stdout)
    assert {r["sweep"] for r in rep["self_reproducibility"] + rep["cross_arm"]} == {"s2"}
    res = runner.invoke(app, ["report", "agreement", "--results", str(results), "--format", "json", "--table", "cross"])
    assert [r["identical"] for r in json.loads(res.stdout)] == [4, 6]
    res = runner.invoke(app, ["report", "agreement", "--results", str(results), "--format", "csv", "--table", "positions"])
    assert res.exit_code == 0 and res.stdout.splitlines()[0].startswith("sweep,arm_a,arm_b,position")
    res = runner.invoke(app, ["report", "agreement", "--results", str(results), "--format", "csv"])
    assert res.exit_code == 2 and "--table" in res.output
    res = runner.invoke(app, ["report", "agreement", "--results", str(results), "--table", "bogus"])
    assert res.exit_code == 2


def test_report_agreement_tables_for_people(results: Path) -> None:
    res = runner.invoke(app, ["report", "agreement", "--results", str(results)], env={"COLUMNS": "220"})
    assert res.exit_code == 0, res.output
    assert "5/6" in res.output and "4/6" in res.output and "1@2, 3@5" in res.output
    assert "2 (h1:201, h2:201)" in res.output and "2 (pids 101, 102)" in res.output
    for table in ("divergence", "positions"):
        res = runner.invoke(app, ["report", "agreement", "--results", str(results), "--table", table,
                                  "--format", "markdown"])
        assert res.exit_code == 0, res.output
        assert res.output.count("\n|") > 6
    empty = runner.invoke(app, ["report", "agreement", "--results", str(results.parent)])
    assert empty.exit_code == 0 and "no sweeps in these results yet" in empty.output
