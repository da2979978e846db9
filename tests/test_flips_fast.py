"""`report flips` without waste (issue #25): the shared-sort computations of reports/fliprisk.py give the
numbers of the plain computation. The rank-form AUC against scikit-learn's roc_auc_score (ties
included); the sequence bootstrap's pair matrix against a brute-force count, and its three
evaluations (dense pair matrix, sparse sufficient statistics, per-position weights) against each other,
to the last bit; and the report of a small store, whose rows DuckDB may return in any order, against
the plain computation over the rows in (ref_restart, prompt_index, position) order."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from reports import fliprisk as fr
from storage.catalog import open_catalog
from storage.store import ResultStore
from tests.conftest import REPO

pytestmark = pytest.mark.usefixtures("ledgered_writes")  # hand-written result files are committed


def tied(n: int, n_seq: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Margins with many exact ties (a long run at 0, rounded values), flips more likely at small margins."""
    rng = np.random.default_rng(seed)
    margin = np.round(rng.lognormal(-2.0, 1.5, n), 2)
    margin[rng.random(n) < 0.1] = 0.0  # one long run of ties, flips and non-flips mixed
    flip = rng.random(n) < 0.3 * np.exp(-3.0 * margin)
    return margin, flip, rng.integers(0, n_seq, n)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rank_auc_equals_sklearn_with_ties(seed: int) -> None:
    margin, flip, _ = tied(2000, 10, seed)
    assert fr.auc(margin, flip) == pytest.approx(roc_auc_score(flip, -margin), abs=1e-12)
    assert fr.auc(margin, np.zeros(margin.size, bool)) is None and fr.auc(margin, np.ones(margin.size, bool)) is None


@pytest.mark.parametrize("run", [1, 3, 64, 10**9])
def test_pair_matrix_counts_every_pair(run: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """2C[a, b]: 2 per (flip in a, non-flip in b) with the flip at the smaller margin, 1 per tie; blocks of
    ``run`` positions or more (many blocks, one block), runs of ties longer than a block included."""
    monkeypatch.setattr(fr, "_PAIR_RUN", run)
    margin, flip, seq = tied(500, 7, 3)
    s = fr._Sorted(margin, flip)
    got = fr._pair_matrix(s, seq[s.order], 7)
    m_f, m_n = margin[flip][:, None], margin[~flip][None, :]
    weight = 2 * (m_f < m_n) + (m_f == m_n)
    want = np.zeros((7, 7), np.int64)
    np.add.at(want, (np.repeat(seq[flip], (~flip).sum()), np.tile(seq[~flip], flip.sum())), weight.ravel())
    assert np.array_equal(got, want)


@pytest.mark.parametrize("run", [2, 64, 10**9])
def test_sequence_bootstrap_evaluations_agree_exactly(run: int, monkeypatch: pytest.MonkeyPatch) -> None:
    margin, flip, seq = tied(1000, 40, 4)
    monkeypatch.setattr(fr, "_PAIR_RUN", run)
    dense = fr.bootstrap_auc(margin, flip, seq, resamples=80, seed=5)
    monkeypatch.setattr(fr, "_PAIR_MATRIX_MAX", 0)  # the sparse sufficient statistics
    sparse = fr.bootstrap_auc(margin, flip, seq, resamples=80, seed=5)
    monkeypatch.setattr(fr, "_SUFFICIENT_STATISTICS", False)  # per-position weights: the reference
    plain = fr.bootstrap_auc(margin, flip, seq, resamples=80, seed=5)
    assert dense["used"] == sparse["used"] == plain["used"] > 60
    assert dense["ci"] == sparse["ci"] == plain["ci"] and dense["sequences"] == 40


def test_one_long_sequence_counts_past_int32() -> None:
    """One sequence of 100,000 positions (``sequence=None``): 2 x flips x non-flips of that one sequence
    pair passes 2^31, so the pair matrix counts in int64; every resample is the data itself."""
    rng = np.random.default_rng(0)
    margin = rng.random(100_000)
    flip = rng.random(100_000) < 0.9 - 0.8 * margin
    assert 2 * int(flip.sum()) * int((~flip).sum()) > 2**31
    point = fr.auc(margin, flip)
    assert point is not None and fr.bootstrap_auc(margin, flip, resamples=3)["ci"] == [point, point]


# -- the report of a small store against the plain computation ------------------------------------------

def _rows(ref_arm: str, arm: str, n_prompts: int, length: int, seed: int) -> list[dict[str, Any]]:
    """Two reference restarts of ``n_prompts`` prompts of ``length`` positions; one row without a margin,
    a reference argmax that is not the reference token every 97th row."""
    rng = np.random.default_rng(seed)
    n = 2 * n_prompts * length
    margin = 10.0 ** rng.uniform(-6, 1, n)
    margin[rng.choice(n, 15, replace=False)] = 0.0
    flip = rng.random(n) < 1.0 / (1.0 + np.exp(5.0 + 1.5 * np.log10(margin + fr.EPS)))
    return [{"unit_id": f"{ref_arm}-{arm}", "experiment": "e2e", "ref_arm": ref_arm,
             "ref_restart": int(i // (n_prompts * length)), "arm": arm, "prompt_index": int(i // length % n_prompts),
             "position": int(i % length), "ref_token": 7, "ref_argmax": 7 if i % 97 else 8,
             "ref_margin": None if i == 5 else float(m), "arm_argmax": 7, "arm_margin": 1.0, "flip": bool(f)}
            for i, (m, f) in enumerate(zip(margin, flip, strict=True))]


def _write(root: Path, shuffle_seed: int) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Two pairs, each written as three files of shuffled rows (the order DuckDB reads is no order)."""
    pairs = {("cutlass", "triton"): _rows("cutlass", "triton", 30, 40, 1),
             ("cutlass", "marlin"): _rows("cutlass", "marlin", 30, 40, 2)}  # 2,400 rows, 60 sequences each
    rng = np.random.default_rng(shuffle_seed)
    for (ref_arm, arm), rows in pairs.items():
        shuffled = [rows[i] for i in rng.permutation(len(rows))]
        for part in range(3):
            ResultStore(root).write("teacher_forced", "s", f"{ref_arm}-{arm}-{part}", shuffled[part::3])
    return pairs


def _plain(rows: list[dict[str, Any]], resamples: int) -> dict[str, Any]:
    """The numbers the report gave before #25, computed directly: rows in (ref_restart, prompt_index,
    position) order, scikit-learn's fit and AUC, masks per bin, the per-position bootstrap."""
    rows = sorted(rows, key=lambda r: (r["ref_restart"], r["prompt_index"], r["position"]))
    rows = [r for r in rows if r["ref_margin"] is not None]
    margin = np.array([r["ref_margin"] for r in rows])
    flip = np.array([r["flip"] for r in rows])
    seq = np.array([100 * r["ref_restart"] + r["prompt_index"] for r in rows])  # numbered in that order
    x = np.log10(margin + fr.EPS)
    mu, sd = float(x.mean()), float(x.std())
    clf = LogisticRegression(C=1.0, max_iter=1000).fit(((x - mu) / sd)[:, None], flip)
    slope = float(clf.coef_[0, 0]) / sd
    intercept = float(clf.intercept_[0]) - slope * mu
    pred = 1.0 / (1.0 + np.exp(-(intercept + slope * x)))
    which = np.searchsorted(np.array(fr.DECADE_EDGES), margin, side="right") - 1
    calibration = [(int((which == i).sum()), int(flip[which == i].sum()), float(pred[which == i].mean()))
                   for i in range(len(fr.DECADE_EDGES) - 1) if (which == i).any()]
    m90 = float(np.quantile(margin[flip], 0.9, method="inverted_cdf"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fr, "_SUFFICIENT_STATISTICS", False)
        boot = fr.bootstrap_auc(margin, flip, seq, resamples=resamples, seed=0)
    return {"positions": len(rows), "flips": int(flip.sum()), "auc": float(roc_auc_score(flip, -margin)),
            "auc_ci": boot["ci"], "used": boot["used"], "intercept": intercept, "slope": slope,
            "calibration": calibration, "margin_90": m90, "share_90": float((margin <= m90).mean())}


def test_report_numbers_equal_the_plain_computation(tmp_path: Path) -> None:
    pairs = _write(tmp_path / "a", shuffle_seed=0)
    _write(tmp_path / "b", shuffle_seed=1)
    with open_catalog(tmp_path / "a") as cat:
        rep = fr.flip_report(cat, sweep="s", resamples=200)
        everything = fr.load(cat, sweep="s")
        whole = fr._from_arrow(cat.named_arrow("flip_positions", sweep="s"))  # the NULL-key route
    with open_catalog(tmp_path / "b") as cat:
        again = fr.flip_report(cat, sweep="s", resamples=200)
    # the same rows read in another order give the same report, to the last bit
    assert json.dumps(rep, sort_keys=True) == json.dumps(again, sort_keys=True)
    assert [(p["ref_arm"], p["arm"]) for p in rep["pairs"]] == [("cutlass", "marlin"), ("cutlass", "triton")]
    for p in rep["pairs"]:
        want = _plain(pairs[(p["ref_arm"], p["arm"])], 200)
        assert (p["positions"], p["flips"], p["dropped"], p["ref_mismatch"]) == (want["positions"], want["flips"], 1, 25)
        assert p["auc"] == pytest.approx(want["auc"], abs=1e-12)
        assert (p["auc_ci"], p["ci"]["used"], p["ci"]["sequences"]) == (want["auc_ci"], want["used"], 60)
        assert (p["model"]["intercept"], p["model"]["slope"]) == (want["intercept"], want["slope"])
        assert [(b["positions"], b["flips"], b["predicted_rate"]) for b in p["calibration"]] == want["calibration"]
        c90 = next(c for c in p["concentration"] if c["flip_share"] == 0.9)
        assert (c90["margin"], c90["share_of_positions"]) == (want["margin_90"], want["share_90"])
    # one pair per query, or the whole selection with its pair ids: the same arrays
    for attr in ("margin", "flip", "sequence", "pair"):
        assert np.array_equal(getattr(everything, attr), getattr(whole, attr)), attr
    assert (everything.pairs, everything.pair_dropped, everything.pair_ref_mismatch) == \
        (whole.pairs, whole.pair_dropped, whole.pair_ref_mismatch)


def test_module_imports_nothing_heavy() -> None:
    """scipy, scikit-learn, pyarrow and DuckDB are imported inside the functions that use them (once per
    process: later imports are a lookup), never when the module is imported."""
    tree = ast.parse((REPO / "reports" / "fliprisk.py").read_text())
    top = {alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    top |= {(node.module or "").split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert top <= {"__future__", "functools", "math", "collections", "typing", "numpy"}, top
