"""The accuracy change per kernel swap in ``report divergence`` (docs/divergence.md "Accuracy change per
kernel swap"), on a hand-built results tree whose counts are known, recomputed here with plain DuckDB over
the Parquet files (SQL written here, not the report's named query).

Sweep `s3`, experiment `answers`, arms a, b, d; 12 prompts with an expected answer and prompt 12 without:
- restart 0: a right on prompts 0-8 (9/12), b right on 0-5, 9, 10 (8/12): a_only = 3 (6, 7, 8), b_only = 2
  (9, 10), change = -1/12; d right exactly where a is, but with another wrong answer on prompt 11: 0
  discordant prompts, 1 answer differs;
- restart 1: b right everywhere (ignored: the change pairs restart 0);
- experiment `other`, arm c: the same prompts on another model: its pairs with a, b, d are skipped.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import duckdb
import pytest
from scipy.stats import binomtest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from reports import divergence as dv
from storage.catalog import open_catalog
from storage.store import ResultStore

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed

PROMPTS = 13  # the last one has no expected answer
RIGHT = {"a": set(range(9)), "b": {0, 1, 2, 3, 4, 5, 9, 10}, "d": set(range(9)), "c": {0, 1}}


def _sha(tokens: list[int]) -> str:
    return hashlib.sha256(b"".join(t.to_bytes(8, "little", signed=True) for t in tokens)).hexdigest()


def _answer(arm: str, restart: int, p: int) -> tuple[list[int], bool | None]:
    if p == PROMPTS - 1:
        return [9, 9], None
    right = p in RIGHT[arm] or (arm == "b" and restart == 1)
    wrong = [p, 101] if arm == "d" and p == 11 else [p, 100]
    return ([p, p] if right else wrong), right


@pytest.fixture
def answered(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    store = ResultStore(root)
    for experiment, arm in (("answers", "a"), ("answers", "b"), ("answers", "d"), ("other", "c")):
        for restart in (0, 1):
            unit = f"s3-{arm}-{restart}"
            rows = []
            for p in range(PROMPTS):
                got, correct = _answer(arm, restart, p)
                toks = [*got, 0]
                rows.append({"unit_id": unit, "experiment": experiment, "arm": arm, "restart": restart,
                             "prompt_index": p, "prompt_hash": _sha([p]), "sequence_hash": _sha(toks),
                             "n_tokens": len(toks), "tokens": toks,
                             "extracted_answer": None if correct is None else got, "correct": correct})
            store.write("sequences", "s3", unit, rows)
            kernel = "int8-triton-order" if arm == "b" else "int8-cutlass-order"
            store.write("arm_runs", "s3", unit, [{
                "unit_id": unit, "experiment": experiment, "arm": arm, "restart": restart,
                "model": "answer-qwen3" if experiment == "answers" else "answer-qwen3-weak", "engine": "cpu-w8a8",
                "configured_kernel": kernel, "scales": "real", "env_json": "{}", "host": "h",
                "pid": 10 * restart + ord(arm), "observed_kernels": [kernel], "kernel_calls_json": "{}",
                "evidence_ok": True, "weights_sha256": "w"}])
    return root


def test_accuracy_change_matches_plain_duckdb_with_the_exact_mcnemar_test(answered: Path) -> None:
    with open_catalog(answered) as cat:
        ans = dv.total_agreement(cat, "s3")["answers"]
    files = sorted(str(f) for f in ResultStore(answered).partition("sequences", "s3").glob("*.parquet"))
    con = duckdb.connect()
    plain = con.sql(f"""
        WITH s AS (SELECT * FROM read_parquet({files!r}, union_by_name = true) WHERE restart = 0 AND correct IS NOT NULL)
        SELECT a.arm, b.arm, count(*), count(*) FILTER (WHERE a.correct AND NOT b.correct),
               count(*) FILTER (WHERE b.correct AND NOT a.correct),
               count(*) FILTER (WHERE a.extracted_answer <> b.extracted_answer)
        FROM s a JOIN s b ON a.experiment = b.experiment AND a.prompt_index = b.prompt_index AND a.arm < b.arm
        GROUP BY ALL ORDER BY ALL""").fetchall()
    got = [(c["arm_a"], c["arm_b"], c["n"], c["a_only"], c["b_only"], c["answers_differ"]) for c in ans["changes"]]
    assert got == plain == [("a", "b", 12, 3, 2, 5), ("a", "d", 12, 0, 0, 1), ("b", "d", 12, 2, 3, 6)]
    ab, ad, _bd = ans["changes"]
    assert ab["experiment"] == "answers" and ab["change"] == pytest.approx(-1 / 12)
    assert ab["mcnemar_p"] == binomtest(2, 5, 0.5).pvalue == pytest.approx(1.0)
    pi = binomtest(2, 5).proportion_ci(confidence_level=0.95, method="exact")
    assert ab["conditional_interval"] == pytest.approx([(2 * pi.low - 1) * 5 / 12, (2 * pi.high - 1) * 5 / 12])
    assert ab["discordant"]["interval"][1] == binomtest(5, 12).proportion_ci(method="exact").high
    assert ab["abs_change_bound"] >= abs(ab["change"])
    # no discordant prompt: the change is 0, no test, and the bound is the exact upper end for 0 / 12
    assert ad["change"] == 0 and ad["mcnemar_p"] is None and ad["conditional_interval"] is None
    bound = binomtest(0, 12).proportion_ci(method="exact").high
    assert ad["abs_change_bound"] == bound and ad["note"] == (
        f"no prompt changed its correctness (0 of 12 discordant); 95% upper confidence bound on |change|: "
        f"{bound:.3g} (Clopper-Pearson, exact)")  # a bound with its level, not an inequality (issue #36)
    # the arm pairs across the two experiments are skipped, each with its reason
    assert sorted((s["arm_a"], s["arm_b"]) for s in ans["changes_skipped"]) == [("a", "c"), ("b", "c"), ("c", "d")]
    assert all("two experiments" in s["reason"] for s in ans["changes_skipped"])


def test_report_divergence_shows_the_change_table(answered: Path) -> None:
    res = runner.invoke(app, ["report", "divergence", "--results", str(answered), "--sweep", "s3", "--table", "tarr"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "accuracy change per kernel swap" in out and "a -> b" in out and "-0.08333" in out
    assert "a -> d: no prompt changed its correctness (0 of 12 discordant); 95% upper confidence bound on |change|: 0.265" in " ".join(out.split())
    assert "skipped a vs c: arms of two experiments (answers, other)" in out
    assert "exact McNemar" in out and "unit: prompts" in out


def test_the_certificate_cell_names_the_paired_change_and_its_test() -> None:
    from reports.certificate import divergence_cells
    from reports.divergence import _accuracy_change

    acc = {"k": 250, "n": 256, "interval": [0.95, 0.99]}
    base: dict[str, Any] = {"first_divergence": None, "tarr_2n": None, "teacher_forced": []}

    def cell(change: dict[str, Any]) -> str:
        div = {**base, "answers": {"arms": {"a": {"accuracy": acc, "tara": acc}}, "tara_2n": None,
                                   "accuracy_change": {"arm_a": "a", "arm_b": "b", **change}}}
        return divergence_cells([{"arm_a": "a", "arm_b": "b", "divergence": div}])[
            "accuracy change per swap (paired, restart 0)"]

    assert cell(_accuracy_change(256, 1, 4)) == ("a->b +3/256 (1 right only under a, 4 only under b); "
                                                 "exact McNemar p 0.375")
    assert cell(_accuracy_change(256, 0, 0)) == ("a->b +0/256 (0 right only under a, 0 only under b); "
                                                 "95% upper confidence bound on |change| 0.0143 (Clopper-Pearson, "
                                                 "0 of 256 prompts discordant)")
