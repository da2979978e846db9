"""The ``divergence`` case of the read benchmarks (benchmarks/bench_reads.py): the hand-written baseline
(benchmarks/reads_baseline.py ``report_divergence``, plain DuckDB + the same scipy calls) gives every
number of ``report divergence``'s JSON on small trees whose numbers tests/test_divergence.py knows, and
the comparison maps the report onto the baseline's keys and finds a changed number.

Trees: tests/test_divergence.py's sweep ``s1`` (two arms, first divergences, teacher-forced pairs with
and without the probability columns) plus a prompt one arm generated only in part, one only arm ``a``
generated, and a teacher-forced pair with probabilities but no KL (as vLLM records it); and its answers sweep (N = 3, accuracy, TARa, the accuracy change), with a third arm in
another experiment (its pairs are skipped by the report, with the experiments named).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from reports import divergence as dv
from storage.catalog import open_catalog
from storage.store import ResultStore
from tests.conftest import REPO
from tests.test_divergence import ANSWERS, _sha, tf_row, write_fixture

sys.path.insert(0, str(REPO / "benchmarks"))

import bench_reads  # noqa: E402
import reads_baseline  # noqa: E402

pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed


def _report(root: Path, sweep: str) -> dict[str, Any]:
    """``report divergence --format json`` at its defaults (the object the CLI prints), through JSON."""
    with open_catalog(root) as cat:
        out: dict[str, Any] = json.loads(json.dumps(dv.divergence(cat, sweep), default=str))
    return out


def _baseline(root: Path) -> dict[str, Any]:
    con, present = reads_baseline.connect(str(root))
    out: dict[str, Any] = json.loads(json.dumps(reads_baseline.report_divergence(con, present), default=str))
    return out


def _write_generated(store: ResultStore, unit: str, arm: str, prompt: int, toks: list[int]) -> None:
    store.write("generations", "s1", unit, [
        {"unit_id": unit, "experiment": "e2e", "arm": arm, "restart": 0, "prompt_index": prompt, "position": i,
         "token": t, "margin": 1.0 + i, "topk_ids": [t], "topk_logits": [1.0]} for i, t in enumerate(toks)])
    store.write("sequences", "s1", unit, [
        {"unit_id": unit, "experiment": "e2e", "arm": arm, "restart": 0, "prompt_index": prompt,
         "prompt_hash": _sha([prompt]), "sequence_hash": _sha(toks), "n_tokens": len(toks), "tokens": toks}])


def test_divergence_baseline_gives_every_number_of_the_report(tmp_path: Path) -> None:
    root = tmp_path / "results"
    write_fixture(root)
    store = ResultStore(root)
    _write_generated(store, "s1-short-a", "a", 9, [7, 8, 9])  # b generated two of a's three positions
    _write_generated(store, "s1-short-b", "b", 9, [7, 8])
    _write_generated(store, "s1-only-a", "a", 11, [5])  # a prompt only a generated
    # a vLLM-like pair: probabilities and k3 recorded, the exact KL not (NULL)
    store.write("teacher_forced", "s1", "tf-ac", [
        {"unit_id": "tf-ac", "experiment": "e2e", "ref_arm": "a", "ref_restart": 0, "arm": "c", "prompt_index": p,
         "position": i, **tf_row(p, i), "kl_ref_arm": None, "flip": False} for p in range(3) for i in range(6)])
    rep, base = _report(root, "s1"), _baseline(root)
    cand, want = tmp_path / "cand.json", tmp_path / "base.json"
    cand.write_text(json.dumps(rep))
    want.write_text(json.dumps({"divergence": base}))
    compared, diffs = bench_reads.check("divergence", cand, want)
    assert diffs == [] and compared > 150
    # the hand counts of tests/test_divergence.py, plus prompts 9 (diverges at 2) and 11 (at 0)
    first = base["first_divergence"]["s1|a|b"]
    assert (first["sequences"], first["diverged"], first["last_position"]) == (6, 4, 5)
    assert first["margins"]["b"]["at_divergence"] == 2  # b has no margin where it lacks the position
    tf = base["distribution"]
    assert tf["s1|a|a-old"] == {"sequences": 1, "positions": 6, "measured_positions": 0, "measured_sequences": 0,
                                "kl_positions": 0, "kl_sequences": 0}
    assert tf["s1|a|b"]["gate"]["passed"] is True and tf["s1|a|b"]["kl"]["interval"] is not None
    assert tf["s1|a|c"]["kl_positions"] == 0 and "kl" not in tf["s1|a|c"] and tf["s1|a|c"]["k3"]["positions"] == 18
    assert tf["s1|a|c"]["gate"]["passed"] is None  # the gate reads the KL, which this pair lacks
    assert base["answers"] == {"recorded": False}
    # a changed number, a pair the baseline lacks: both reported
    off = copy.deepcopy(base)
    off["distribution"]["s1|a|b"]["kl"]["se"] *= 1.01
    del off["flip_buckets"]["s1|a|b"]
    want.write_text(json.dumps({"divergence": off}))
    _, diffs = bench_reads.check("divergence", cand, want)
    assert [d.split(":")[0] for d in diffs] == ["divergence.distribution.s1|a|b.kl.se",
                                                "divergence.flip_buckets.s1|a|b"]


def test_divergence_baseline_gives_the_answers_figures(tmp_path: Path) -> None:
    root = tmp_path / "results"
    store = ResultStore(root)
    arms = {"a": "answers", "b": "answers", "c": "other"}  # c: another experiment's arm (a copy of b's answers)
    for arm, experiment in arms.items():
        for restart in range(3):
            unit = f"s2-{arm}-{restart}"
            rows = []
            for p in range(4):
                got, want = ANSWERS["b" if arm == "c" else arm, p]
                toks = [*(got[restart] or [9]), 0]
                rows.append({"unit_id": unit, "experiment": experiment, "arm": arm, "restart": restart,
                             "prompt_index": p, "prompt_hash": _sha([p]), "sequence_hash": _sha(toks),
                             "n_tokens": len(toks), "tokens": toks, "extracted_answer": got[restart],
                             "correct": None if want is None else got[restart] == want})
            store.write("sequences", "s2", unit, rows)
    rep, base = _report(root, "s2"), _baseline(root)
    view = bench_reads._divergence_view(rep)
    assert bench_reads.compare(view, base) == [] and set(view["answers"]) == set(base["answers"])
    ans = base["answers"]
    assert ans["arms"]["s2|a"]["accuracy"][:2] == [5, 9] and ans["arms"]["s2|a"]["tara"][:2] == [2, 3]
    assert ans["pairs"]["s2|a|b"][:2] == [2, 3]
    change = ans["changes"]["s2|a|b"]  # restart 0: prompt 2 right under a only
    assert (change["n"], change["a_only"], change["b_only"], change["mcnemar_p"]) == (3, 1, 0, 1.0)
    assert ans["changes_skipped"] == {"s2|a|c": ["answers", "other"], "s2|b|c": ["answers", "other"]}
    assert bench_reads._count(base["answers"]) > 40
