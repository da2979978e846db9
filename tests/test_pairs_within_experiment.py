"""Arm pairs are formed within one experiment: an arm of another experiment runs another model or other
prompts, so pairing it would report a model difference as a kernel swap (a silent wrong answer: the
certificate counted such a pair as end-to-end evidence for the two kernels)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from storage.catalog import open_catalog
from storage.store import ResultStore
from tests.test_divergence import PROMPTS, _sha, write_fixture

pytestmark = pytest.mark.usefixtures("ledgered_writes")


def _other_experiment(root: Path) -> None:
    """Arm ``c`` of experiment ``other``: another model, the same prompt indices, tokens that differ
    from both ``e2e`` arms everywhere, and a kernel that differs from arm ``a``'s."""
    store = ResultStore(root)
    unit = "s1-c-0"
    gens, seqs = [], []
    for p in range(PROMPTS):
        toks = [900 + p + i for i in range(6)]
        gens += [{"unit_id": unit, "experiment": "other", "arm": "c", "restart": 0, "prompt_index": p, "position": i,
                  "token": t, "margin": 0.5, "topk_ids": [t, t + 1], "topk_logits": [5.0, 4.5]} for i, t in enumerate(toks)]
        seqs.append({"unit_id": unit, "experiment": "other", "arm": "c", "restart": 0, "prompt_index": p,
                     "prompt_hash": _sha([p]), "sequence_hash": _sha(toks), "n_tokens": len(toks), "tokens": toks})
    store.write("generations", "s1", unit, gens)
    store.write("sequences", "s1", unit, seqs)
    store.write("arm_runs", "s1", unit, [{
        "unit_id": unit, "experiment": "other", "arm": "c", "restart": 0, "model": "answer-qwen3", "engine": "cpu-w8a8",
        "configured_kernel": "int8-triton-order", "scales": "real", "env_json": "{}", "host": "h", "pid": 99,
        "observed_kernels": ["int8-triton-order"], "kernel_calls_json": "{}", "evidence_ok": True, "weights_sha256": "x"}])


@pytest.fixture
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    write_fixture(root)
    _other_experiment(root)
    return root


@pytest.mark.parametrize("query", ["cross_arm", "first_divergence", "divergence_first_from_sequences",
                                   "divergence_pair_runs", "position_agreement", "divergence_prefix_margins"])
def test_every_pairing_query_pairs_arms_of_one_experiment(results: Path, query: str) -> None:
    with open_catalog(results) as cat:
        pairs = {(r["arm_a"], r["arm_b"]) for r in cat.named(query, sweep="s1")}
    assert pairs == {("a", "b")}


def test_the_certificate_and_agreement_show_no_cross_experiment_pair(results: Path) -> None:
    cert = CliRunner().invoke(app, ["report", "certificate", "--results", str(results), "--format", "json"])
    assert cert.exit_code == 0, cert.output
    arm_pairs = {(p["arm_a"], p["arm_b"]) for c in json.loads(cert.stdout) for sm in c["scale_modes"]
                 for p in sm["end_to_end"].get("arm_pairs", [])}
    assert arm_pairs == {("a", "b")}
    agree = CliRunner().invoke(app, ["report", "agreement", "--results", str(results), "--format", "json"])
    assert agree.exit_code == 0, agree.output
    rep = json.loads(agree.stdout)
    for section in ("cross_arm", "position_agreement", "first_divergence"):
        assert {(r["arm_a"], r["arm_b"]) for r in rep[section]} == {("a", "b")}, section
    assert {r["arm"] for r in rep["self_reproducibility"]} == {"a", "b", "c"}  # each arm on its own still
