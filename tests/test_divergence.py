"""``report divergence`` on a hand-built results tree whose every number is known, each figure recomputed
here with plain DuckDB over the Parquet files (SQL written here, not the report's named queries).

Sweep `s1`, arms `a` and `b` (real scales), restarts 0 and 1, 4 prompts of 6 generated tokens:
- a: both restarts identical on every prompt (TARr@2 = 4/4);
- b restart 0: prompt 1 diverges from a at position 2, prompt 2 at position 4, prompts 0 and 3 identical
  to a to the end (right-censored at position 5);
- b restart 1: as restart 0 but prompt 3 differs at position 5 (TARr@2 = 3/4, 5 distinct of 8).
Kaplan-Meier by hand: S(t) = 1 for t < 2, 3/4 on [2, 4), 3/4 * 2/3 = 1/2 from 4: quartile 2, median 4,
third quartile not reached. All four runs of the pair agree on prompt 0 only (1/4).
Teacher-forced pair a -> b: per position known p_ref, p_arm, KL and k3; pair a -> a-old: a file written
before the probability columns existed (NULL there: counted, never made up).
"""

from __future__ import annotations

import hashlib
import json
import math
import traceback
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from scipy.stats import binomtest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from reports import divergence as dv
from storage.catalog import open_catalog
from storage.store import ResultStore

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed

PROMPTS, LENGTH = 4, 6


def _sha(tokens: list[int]) -> str:
    return hashlib.sha256(b"".join(t.to_bytes(8, "little", signed=True) for t in tokens)).hexdigest()


def _tokens(arm: str, restart: int, p: int) -> list[int]:
    t = [100 * p + i for i in range(LENGTH)]
    if arm == "b":
        if p == 1:
            t = [x + 1000 if i >= 2 else x for i, x in enumerate(t)]
        if p == 2:
            t[4] += 1000
        if p == 3 and restart == 1:
            t[5] += 2000
    return t


def _margin(arm: str, i: int) -> float:
    return (1.0 if arm == "a" else 2.0) + 0.25 * i


def tf_row(p: int, i: int) -> dict[str, Any]:
    """Teacher-forced position (prompt p, position i) of a -> b, with values chosen to be known."""
    p_ref = 0.05 + 0.15 * i
    p_arm = p_ref - 0.01 * (p + 1)
    kl = 0.001 * (p + 1) * (i + 1)
    r = p_arm / p_ref
    return {"ref_token": 100 * p + i, "ref_argmax": 100 * p + i, "ref_margin": 0.5 + i,
            "arm_argmax": 100 * p + i + (1 if (p % 2 == 1 and i % 3 == 0) else 0), "arm_margin": 0.5 + i,
            "ref_token_prob_ref": p_ref, "ref_token_prob_arm": p_arm, "kl_ref_arm": kl,
            "k3_ref_arm": r - 1 - math.log(r)}


def write_fixture(root: Path) -> None:
    store = ResultStore(root)
    for arm, kernel in (("a", "int8-cutlass-order"), ("b", "int8-triton-order")):
        for restart in (0, 1):
            unit = f"s1-{arm}-{restart}"
            gens, seqs = [], []
            for p in range(PROMPTS):
                toks = _tokens(arm, restart, p)
                gens += [{"unit_id": unit, "experiment": "e2e", "arm": arm, "restart": restart, "prompt_index": p,
                          "position": i, "token": tok, "margin": _margin(arm, i), "topk_ids": [tok, tok + 1],
                          "topk_logits": [5.0, 5.0 - _margin(arm, i)]} for i, tok in enumerate(toks)]
                seqs.append({"unit_id": unit, "experiment": "e2e", "arm": arm, "restart": restart, "prompt_index": p,
                             "prompt_hash": _sha([p]), "sequence_hash": _sha(toks), "n_tokens": len(toks),
                             "tokens": toks})
            store.write("generations", "s1", unit, gens)
            store.write("sequences", "s1", unit, seqs)
            store.write("arm_runs", "s1", unit, [{
                "unit_id": unit, "experiment": "e2e", "arm": arm, "restart": restart, "model": "tiny-qwen3",
                "engine": "cpu-w8a8", "configured_kernel": kernel, "scales": "real", "env_json": "{}", "host": "h",
                "pid": 10 * restart + (1 if arm == "a" else 2), "observed_kernels": [kernel], "kernel_calls_json": "{}",
                "evidence_ok": True, "weights_sha256": "w"}])
    base = {"experiment": "e2e", "ref_restart": 0, "flip": None}
    rows = []
    for p in range(PROMPTS):
        for i in range(LENGTH):
            r = {**base, "unit_id": "tf-ab", "ref_arm": "a", "arm": "b", "prompt_index": p, "position": i, **tf_row(p, i)}
            r["flip"] = r["ref_argmax"] != r["arm_argmax"]
            rows.append(r)
    store.write("teacher_forced", "s1", "tf-ab", rows)
    old = [{k: v for k, v in r.items() if k not in ("ref_token_prob_ref", "ref_token_prob_arm", "kl_ref_arm",
                                                    "k3_ref_arm")} | {"unit_id": "tf-old", "arm": "a-old"}
           for r in rows[:6]]
    store.write("teacher_forced", "s1", "tf-old", old)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    write_fixture(tmp_path / "results")
    return tmp_path / "results"


@pytest.fixture
def rep(results: Path) -> dict[str, Any]:
    with open_catalog(results) as cat:
        return dv.divergence(cat, "s1", resamples=500)


def plain(results: Path, table: str) -> str:
    """``read_parquet`` over the table's files of sweep s1: plain DuckDB, no catalog."""
    return plain_sweep(results, table, "s1")


def plain_sweep(results: Path, table: str, sweep: str) -> str:
    files = sorted(str(f) for f in ResultStore(results).partition(table, sweep).glob("*.parquet"))
    return f"read_parquet({files!r}, union_by_name = true)"


def test_first_divergence_and_survival_match_plain_duckdb_and_the_hand_count(results: Path, rep: dict[str, Any]) -> None:
    con = duckdb.connect()
    g = plain(results, "generations")
    rows = con.sql(f"""
        SELECT x.prompt_index, min(x.position) FILTER (WHERE x.token <> y.token) AS first
        FROM {g} x JOIN {g} y ON x.prompt_index = y.prompt_index AND x.position = y.position
        WHERE x.arm = 'a' AND y.arm = 'b' AND x.restart = 0 AND y.restart = 0
        GROUP BY x.prompt_index ORDER BY x.prompt_index""").fetchall()
    assert rows == [(0, None), (1, 2), (2, 4), (3, None)]
    (p,) = rep["first_divergence"]
    assert (p["arm_a"], p["arm_b"], p["sequences"], p["diverged"], p["identical"]) == ("a", "b", 4, 2, 2)
    events = sorted(r[1] for r in rows if r[1] is not None)
    assert [c["t"] for c in p["survival"]["curve"]] == events
    assert [c["survival"] for c in p["survival"]["curve"]] == pytest.approx([3 / 4, 1 / 2])
    assert p["survival"]["quantiles"] == {"0.1": 2, "0.25": 2, "0.5": 4, "0.75": None, "0.9": None}
    assert p["diverged_positions"]["median"] == 3.0 and p["diverged_positions"]["max"] == 4
    # margins at the first divergence (a: 1 + 0.25 t) vs the identical-prefix positions (before it, or all)
    m = p["margins"]["a"]
    assert m["median_at_divergence"] == pytest.approx(np.median([1.5, 2.0]))
    prefix = [_margin("a", i) for i in range(LENGTH)] * 2 + [_margin("a", i) for i in range(2)] + \
        [_margin("a", i) for i in range(4)]
    assert m["prefix_positions"] == len(prefix) == 18 and m["median_prefix"] == pytest.approx(np.median(prefix))


def test_tarr_and_distinct_completions_match_plain_duckdb(results: Path, rep: dict[str, Any]) -> None:
    con = duckdb.connect()
    s = plain(results, "sequences")
    per_arm = dict(con.sql(f"""
        SELECT arm, count(*) FILTER (WHERE n = 1) FROM (
            SELECT arm, prompt_index, count(DISTINCT sequence_hash) AS n FROM {s} GROUP BY arm, prompt_index)
        GROUP BY arm""").fetchall())
    distinct = dict(con.sql(f"""
        SELECT arm, sum(n) FROM (SELECT arm, prompt_index, count(DISTINCT sequence_hash) AS n FROM {s}
                                 GROUP BY arm, prompt_index) GROUP BY arm""").fetchall())
    (pair_ok, pair_distinct), = con.sql(f"""
        SELECT count(*) FILTER (WHERE n = 1), sum(n) FROM (
            SELECT prompt_index, count(DISTINCT sequence_hash) AS n FROM {s} GROUP BY prompt_index)""").fetchall()
    arms = {a["arm"]: a for a in rep["total_agreement"]["arms"]}
    assert {k: a["tarr"]["k"] for k, a in arms.items()} == per_arm == {"a": 4, "b": 3}
    assert {k: a["distinct"]["total"] for k, a in arms.items()} == distinct == {"a": 4, "b": 5}
    assert (arms["b"]["distinct"]["median"], arms["b"]["distinct"]["max"], arms["b"]["distinct"]["completions"]) == (1, 2, 8)
    ci = binomtest(3, 4).proportion_ci(confidence_level=0.95, method="exact")
    assert arms["b"]["tarr"]["interval"] == [ci.low, ci.high] and "Clopper-Pearson" in arms["b"]["tarr"]["method"]
    (p,) = rep["total_agreement"]["pairs"]
    assert (p["tarr"]["k"], p["tarr"]["n"], p["distinct"]["total"]) == (pair_ok, 4, pair_distinct) == (1, 4, 7)
    assert p["distinct"]["completions"] == 16 and p["distinct"]["max"] == 2


def test_probs_diff_k3_and_mismatch_kl_match_plain_duckdb(results: Path, rep: dict[str, Any]) -> None:
    con = duckdb.connect()
    t = plain(results, "teacher_forced")
    ((pd_mean, pd_max, k3, kl),) = con.sql(f"""
        SELECT avg(abs(ref_token_prob_ref - ref_token_prob_arm)), max(abs(ref_token_prob_ref - ref_token_prob_arm)),
               avg(k3_ref_arm), avg(kl_ref_arm)
        FROM {t} WHERE ref_arm = 'a' AND arm = 'b'""").fetchall()
    ((kl_seq,),) = con.sql(f"""SELECT avg(s) FROM (SELECT sum(kl_ref_arm) AS s FROM {t} WHERE arm = 'b'
                            GROUP BY ref_restart, prompt_index)""").fetchall()
    by = {(p["ref_arm"], p["arm"]): p for p in rep["distribution"]}
    p = by["a", "b"]
    assert p["probs_diff"]["mean_per_position"] == pytest.approx(pd_mean) == pytest.approx(0.025)
    assert p["probs_diff"]["max"] == pytest.approx(pd_max) == pytest.approx(0.04)
    assert p["k3"]["mean_per_position"] == pytest.approx(k3)
    assert p["kl"]["mean_per_position"] == pytest.approx(kl) == pytest.approx(0.001 * 2.5 * 3.5)
    assert p["kl"]["mean_per_sequence"] == pytest.approx(kl_seq) == pytest.approx(0.001 * 2.5 * 21)
    lo, hi = p["kl"]["per_position"]["interval"]
    assert lo <= p["kl"]["mean_per_position"] <= hi and p["bootstrap"]["sequences"] == 4
    assert "resampling reference sequences" in p["bootstrap"]["method"]
    g = p["gate"]
    assert g["bound"] == pytest.approx(abs(g["mean"]) + 2 * g["se"]) and g["se"] > 0
    assert g["passed"] is (g["bound"] < 0.015) and g["threshold"] == 0.015
    old = by["a", "a-old"]  # written before the columns existed: counted, no figure made up
    assert (old["positions"], old["measured_positions"]) == (6, 0) and "kl" not in old and "before" in old["note"]


def test_flip_buckets_are_counted_with_exact_intervals(results: Path, rep: dict[str, Any]) -> None:
    con = duckdb.connect()
    t = plain(results, "teacher_forced")
    (got,) = con.sql(f"""SELECT count(*), count(*) FILTER (WHERE flip) FROM {t}
                      WHERE arm = 'b' AND ref_token_prob_ref >= 0.1 AND ref_token_prob_ref < 0.9""").fetchall()
    (p,) = [x for x in rep["flip_buckets"] if x["arm"] == "b"]
    assert (p["middle"]["n"], p["middle"]["k"]) == got
    assert sum(b["n"] for b in p["buckets"]) == 24 and sum(b["k"] for b in p["buckets"]) == 4
    for b in p["buckets"]:
        if b["n"]:
            ci = binomtest(b["k"], b["n"]).proportion_ci(confidence_level=0.95, method="exact")
            assert b["interval"] == [ci.low, ci.high]


@pytest.mark.slow  # report all renders every report: about 9 s on a loaded 2-core machine
def test_cli_report_all_and_certificate_show_it(results: Path) -> None:
    out = runner.invoke(app, ["report", "divergence", "--results", str(results), "--sweep", "s1", "--format", "json",
                              "--resamples", "200"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert {"first_divergence", "total_agreement", "distribution", "flip_buckets"} <= set(got)
    table = runner.invoke(app, ["report", "divergence", "--results", str(results), "--sweep", "s1"])
    assert table.exit_code == 0, "".join(traceback.format_exception(*table.exc_info)) if table.exc_info else table.output
    assert "TARa@N: no answers recorded" in table.output and "[0.1, 0.9)" in table.output
    csv = runner.invoke(app, ["report", "divergence", "--results", str(results), "--sweep", "s1", "--format", "csv",
                              "--table", "tarr"])
    assert csv.exit_code == 0 and csv.output.splitlines()[0].startswith("sweep,arm_a,arm_b,restarts,prompts,tarr_k")
    assert "s1,b,,2,4,3,4,0.75," in csv.output  # numbers, not formatted text
    bad = runner.invoke(app, ["report", "divergence", "--results", str(results), "--threshold", "-1"])
    assert bad.exit_code == 2 and "--threshold" in bad.output
    md = runner.invoke(app, ["report", "all", "--results", str(results), "--sweep", "s1", "--format", "markdown"])
    assert md.exit_code == 0 and "mismatch KL" in md.output and "TARr@N" in md.output
    cert = runner.invoke(app, ["report", "certificate", "--results", str(results), "--sweep", "s1", "--format", "json"])
    (c,) = json.loads(cert.output)
    (pair,) = [p for s in c["scale_modes"] for p in s["end_to_end"].get("arm_pairs", [])]
    d = pair["divergence"]
    assert d["first_divergence"] == {"sequences": 4, "diverged": 2, "km_median": 4, "diverged_median": 3.0}
    assert (d["tarr_2n"]["k"], d["tarr_2n"]["n"]) == (1, 4)
    (tf,) = d["teacher_forced"]
    assert tf["probs_diff_max"] == pytest.approx(0.04) and tf["gate"]["metric"] == "kl"


#: Sweep s2, N = 3 restarts: (arm, prompt) -> the extracted answer of restarts 0, 1, 2 (None: no expected
#: answer) and the expected answer. a: 5/9 correct, TARa@3 2/3 (prompt 2 answers 7, 7, 8); b: 3/9, 3/3;
#: all 6 runs agree on prompts 0 and 1 only (2/3).
ANSWERS: dict[tuple[str, int], tuple[list[Any], Any]] = {("a", 0): ([[1, 2]] * 3, [1, 2]), ("a", 1): ([[3]] * 3, [4]), ("a", 2): ([[7], [7], [8]], [7]),
           ("a", 3): ([None] * 3, None),
           ("b", 0): ([[1, 2]] * 3, [1, 2]), ("b", 1): ([[3]] * 3, [4]), ("b", 2): ([[5]] * 3, [7]),
           ("b", 3): ([None] * 3, None)}


@pytest.fixture
def answered(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    store = ResultStore(root)
    for arm in ("a", "b"):
        for restart in range(3):
            unit = f"s2-{arm}-{restart}"
            rows = []
            for p in range(4):
                got, want = ANSWERS[arm, p]
                toks = [*(got[restart] or [9]), 0]
                rows.append({"unit_id": unit, "experiment": "answers", "arm": arm, "restart": restart,
                             "prompt_index": p, "prompt_hash": _sha([p]), "sequence_hash": _sha(toks),
                             "n_tokens": len(toks), "tokens": toks, "extracted_answer": got[restart],
                             "correct": None if want is None else got[restart] == want})
            store.write("sequences", "s2", unit, rows)
            kernel = "int8-cutlass-order" if arm == "a" else "int8-triton-order"
            store.write("arm_runs", "s2", unit, [{
                "unit_id": unit, "experiment": "answers", "arm": arm, "restart": restart, "model": "answer-qwen3",
                "engine": "cpu-w8a8", "configured_kernel": kernel, "scales": "real", "env_json": "{}", "host": "h",
                "pid": 10 * restart + (1 if arm == "a" else 2), "observed_kernels": [kernel],
                "kernel_calls_json": "{}", "evidence_ok": True, "weights_sha256": "w"}])
    return root


def test_accuracy_and_tara_match_plain_duckdb(answered: Path) -> None:
    with open_catalog(answered) as cat:
        ans = dv.total_agreement(cat, "s2")["answers"]
    con = duckdb.connect()
    s = plain_sweep(answered, "sequences", "s2")
    acc = dict((a, (k, n)) for a, k, n in con.sql(
        f"SELECT arm, count(*) FILTER (WHERE correct), count(correct) FROM {s} GROUP BY arm").fetchall())
    tara = dict((a, (k, n)) for a, k, n in con.sql(f"""
        SELECT arm, count(*) FILTER (WHERE d = 1), count(*) FROM (
            SELECT arm, prompt_index, count(DISTINCT extracted_answer) AS d FROM {s}
            WHERE extracted_answer IS NOT NULL GROUP BY arm, prompt_index) GROUP BY arm""").fetchall())
    assert ans["recorded"] is True
    got = {a["arm"]: a for a in ans["arms"]}
    assert {k: (a["accuracy"]["k"], a["accuracy"]["n"]) for k, a in got.items()} == acc == {"a": (5, 9), "b": (3, 9)}
    assert {k: (a["tara"]["k"], a["tara"]["n"]) for k, a in got.items()} == tara == {"a": (2, 3), "b": (3, 3)}
    ci = binomtest(5, 9).proportion_ci(confidence_level=0.95, method="exact")
    assert got["a"]["accuracy"]["interval"] == [ci.low, ci.high]
    ((pair_k, pair_n),) = con.sql(f"""
        SELECT count(*) FILTER (WHERE d = 1), count(*) FROM (
            SELECT prompt_index, count(DISTINCT extracted_answer) AS d FROM {s}
            WHERE extracted_answer IS NOT NULL GROUP BY prompt_index)""").fetchall()
    (pair,) = ans["pairs"]
    assert (pair["tara"]["k"], pair["tara"]["n"]) == (pair_k, pair_n) == (2, 3)
    cert = runner.invoke(app, ["report", "certificate", "--results", str(answered), "--sweep", "s2", "--format", "json"])
    (c,) = json.loads(cert.output)
    (arm_pair,) = [p for m in c["scale_modes"] for p in m["end_to_end"].get("arm_pairs", [])]
    shown = arm_pair["divergence"]["answers"]
    assert shown["arms"]["a"]["accuracy"]["k"] == 5 and shown["tara_2n"]["k"] == 2


def test_first_divergence_from_the_token_lists_equals_the_per_position_query(results: Path) -> None:
    """The certificate's first divergences (sequences' token lists) are the report's (generations)."""
    store = ResultStore(results)
    # a prompt one arm generated only part of, and one only arm "a" generated
    for arm, toks in (("a", [7, 8, 9]), ("b", [7, 8])):
        store.write("generations", "s1", f"s1-short-{arm}", [
            {"unit_id": f"s1-short-{arm}", "experiment": "e2e", "arm": arm, "restart": 0, "prompt_index": 9,
             "position": i, "token": t, "margin": 1.0, "topk_ids": [t], "topk_logits": [1.0]} for i, t in enumerate(toks)])
        store.write("sequences", "s1", f"s1-short-{arm}", [
            {"unit_id": f"s1-short-{arm}", "experiment": "e2e", "arm": arm, "restart": 0, "prompt_index": 9,
             "prompt_hash": _sha([9]), "sequence_hash": _sha(toks), "n_tokens": len(toks), "tokens": toks}])
    store.write("generations", "s1", "s1-only-a", [
        {"unit_id": "s1-only-a", "experiment": "e2e", "arm": "a", "restart": 0, "prompt_index": 11,
         "position": 0, "token": 5, "margin": 1.0, "topk_ids": [5], "topk_logits": [1.0]}])
    store.write("sequences", "s1", "s1-only-a", [
        {"unit_id": "s1-only-a", "experiment": "e2e", "arm": "a", "restart": 0, "prompt_index": 11,
         "prompt_hash": _sha([11]), "sequence_hash": _sha([5]), "n_tokens": 1, "tokens": [5]}])
    keep = ("sweep", "arm_a", "arm_b", "prompt_index", "positions", "first_divergence")
    with open_catalog(results) as cat:
        per_position = [{k: r[k] for k in keep} for r in cat.named("first_divergence", sweep="s1")]
        from_lists = [{k: r[k] for k in keep} for r in cat.named("divergence_first_from_sequences", sweep="s1")]
    assert from_lists == per_position
    by_prompt = {r["prompt_index"]: r for r in from_lists}
    assert by_prompt[9]["first_divergence"] == 2 and by_prompt[9]["positions"] == 3
    assert by_prompt[11]["first_divergence"] == 0 and by_prompt[0]["first_divergence"] is None
    assert by_prompt[1]["first_divergence"] == 2


def test_the_certificates_lighter_computation_gives_the_same_pair_figures(results: Path) -> None:
    """``for_certificate`` skips the intervals and buckets a certificate does not show (issue #25); what
    it shows is the same to the last bit as from the whole report."""
    with open_catalog(results) as cat:
        light, whole = dv.for_certificate(cat, "s1"), dv.divergence(cat, "s1", margins=False)
    assert dv.pair_figures(light, "a", "b") == dv.pair_figures(whole, "a", "b")
    (d,) = [p for p in light["distribution"] if p["arm"] == "b"]
    assert "per_position" not in d["probs_diff"] and "per_position" not in d["k3"] and "per_sequence" not in d["kl"]
    assert d["kl"]["per_position"]["interval"] is not None and d["gate"]["se"] is not None
    assert all(set(b) == {"sweep", "ref_arm", "arm", "middle"} for b in light["flip_buckets"])
    # the certificate's KL interval names what it rests on: its sequences and positions (issue #36)
    from reports.certificate import divergence_cells

    fig = dv.pair_figures(light, "a", "b")
    (t,) = [t for t in fig["teacher_forced"] if t["arm"] == "b"]
    cell = divergence_cells([{"arm_a": "a", "arm_b": "b", "divergence": fig}])["probs_diff / k3 / KL per position [95%]"]
    assert t["kl_sequences"] == d["kl"]["sequences"] >= 2
    assert f"(bootstrap over {t['kl_sequences']} sequences, {t['kl_positions']} positions)" in cell


def test_the_margins_from_sequence_lists_equal_the_per_position_queries(results: Path) -> None:
    """divergence_margins.sql (one aggregation into lists) against first_divergence.sql and
    divergence_prefix_margins.sql (per-position joins), on a tree with a short and a one-arm prompt."""
    with open_catalog(results) as cat:
        lists = dv._pairs_from_lists(cat.named_arrow("divergence_margins", sweep="s1"))
        rows = dv._pairs_from_rows(cat, "s1", True)
        assert cat.named_arrow("divergence_margins", sweep="s1")["contiguous"].to_pylist() == [True]
    assert lists.keys() == rows.keys() and lists
    for key, got in lists.items():
        want = rows[key]
        assert (got["first"], got["positions"]) == (want["first"], want["positions"])
        for part in ("at", "prefix"):
            for side in ("a", "b"):
                assert sorted(got[part][side]) == sorted(want[part][side]), (key, part, side)
                assert len(got[part][side]) > 0


def test_positions_that_are_not_0_to_n_fall_back_to_the_per_position_queries(tmp_path: Path) -> None:
    root = tmp_path / "results"
    write_fixture(root)
    store = ResultStore(root)
    gap = [{"unit_id": "s1-a-gap", "experiment": "e2e", "arm": "a", "restart": 0, "prompt_index": 9, "position": p,
            "token": 5, "margin": 1.0, "topk_ids": [5, 6], "topk_logits": [2.0, 1.0]} for p in (0, 2)]
    store.write("generations", "s1", "s1-a-gap", gap)
    with open_catalog(root) as cat:
        assert False in cat.named_arrow("divergence_margins", sweep="s1")["contiguous"].to_pylist()
        (p,) = dv.first_divergence(cat, "s1")
        rows = dv._pairs_from_rows(cat, "s1", True)[("s1", "a", "b")]
    assert p["sequences"] == len(rows["first"]) == PROMPTS + 1 and p["last_position"] == LENGTH - 1


def test_a_pair_that_never_diverges_has_no_margins_at_a_divergence(tmp_path: Path) -> None:
    """divergence_margins.sql gives a NULL list where no prompt of the pair diverged: read as none."""
    root = tmp_path / "results"
    store = ResultStore(root)
    for arm in ("a", "b"):
        unit = f"s1-{arm}-0"
        store.write("generations", "s1", unit, [
            {"unit_id": unit, "experiment": "e2e", "arm": arm, "restart": 0, "prompt_index": 0, "position": i,
             "token": 7 + i, "margin": 1.0 + i, "topk_ids": [7 + i, 8 + i], "topk_logits": [2.0, 1.0]} for i in range(3)])
    with open_catalog(root) as cat:
        (p,) = dv.first_divergence(cat, "s1")
    assert (p["sequences"], p["diverged"], p["identical"]) == (1, 0, 1)
    assert p["margins"]["a"]["at_divergence"] == 0 and p["margins"]["a"]["prefix_positions"] == 3
