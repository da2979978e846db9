"""Cold-restart generation and teacher-forced replay on the tiny W8A8 model, end to end on Ray.

The sweep of this module starts a fresh worker process per arm and restart (4 cold starts of torch and
the model: ~40 s on 2 cores), so its tests are `slow`. Their fast siblings in the default set:
tests/test_quantize_report.py runs the generate kind (restarts = 1, four arms) and teacher-forced
replay through Ray and recomputes the report's figures from the rows; the evidence rules and the
missing-reference error below run here in the default set."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from storage.catalog import read_only_query
from tasks.models.evidence import kernel_evidence

runner = CliRunner()

SPEC = """
question = "Do the arms reproduce themselves and each other?"
name = "gen-tiny"

[experiments.e2e]
kind = "generate"
restarts = 2
prompts = { count = 6, length = 8, seed = 1 }
max_new_tokens = 12

[experiments.e2e.arms.cutlass-pow2]
kernel = "int8-cutlass-order"
scales = "pow2"

[experiments.e2e.arms.triton-pow2]
kernel = "int8-triton-order"
scales = "pow2"

[[experiments.e2e.teacher_forced]]
reference = "cutlass-pow2"
arms = ["triton-pow2"]
"""


@pytest.fixture(scope="module")
def gen_results(ray_local, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gen")
    (d / "spec.toml").write_text(SPEC)
    res = runner.invoke(app, ["sweep", "launch", str(d / "spec.toml"), "--results", str(d / "results"), "--no-progress"])
    assert res.exit_code == 0, res.output
    return d / "results"


def q(results: Path, sql: str) -> list[dict]:
    return read_only_query(results, sql).to_pylist()


@pytest.mark.slow
def test_each_restart_is_a_fresh_process_and_reproduces(gen_results: Path) -> None:
    runs = q(gen_results, "SELECT arm, restart, pid, evidence_ok, observed_kernels FROM arm_runs ORDER BY arm, restart")
    assert len(runs) == 4 and all(r["evidence_ok"] for r in runs)
    for arm in ("cutlass-pow2", "triton-pow2"):
        pids = {r["pid"] for r in runs if r["arm"] == arm}
        assert len(pids) == 2, "each cold restart runs in its own process"
    same = q(gen_results, """
        SELECT arm, count(*) AS prompts, count(*) FILTER (WHERE n_hashes = 1) AS identical FROM (
            SELECT arm, prompt_index, count(DISTINCT sequence_hash) AS n_hashes FROM sequences GROUP BY ALL)
        GROUP BY arm ORDER BY arm""")
    assert same == [{"arm": "cutlass-pow2", "prompts": 6, "identical": 6},
                    {"arm": "triton-pow2", "prompts": 6, "identical": 6}]


@pytest.mark.slow
def test_pow2_arms_agree_end_to_end(gen_results: Path) -> None:
    rows = q(gen_results, """
        SELECT count(*) FILTER (WHERE a.sequence_hash = b.sequence_hash) AS identical, count(*) AS n
        FROM sequences a JOIN sequences b USING (prompt_index, restart)
        WHERE a.arm = 'cutlass-pow2' AND b.arm = 'triton-pow2' AND restart = 0""")
    assert rows == [{"identical": 6, "n": 6}]
    gens = q(gen_results, "SELECT count(*) AS n, min(margin) >= 0 AS nonneg, min(len(topk_ids)) AS k FROM generations")
    assert gens == [{"n": 4 * 6 * 12, "nonneg": True, "k": 5}]


@pytest.mark.slow
def test_teacher_forced_rows(gen_results: Path) -> None:
    rows = q(gen_results, "SELECT * FROM teacher_forced ORDER BY prompt_index, position")
    assert len(rows) == 6 * 12
    assert all(r["ref_argmax"] == r["ref_token"] for r in rows), "teacher forcing reproduces greedy decoding"
    assert all(r["flip"] == (r["ref_argmax"] != r["arm_argmax"]) for r in rows)
    assert not any(r["flip"] for r in rows)  # pow2 scales: no flips at all
    margins = q(gen_results, """
        SELECT count(*) AS n FROM teacher_forced t JOIN generations g
          ON g.arm = t.ref_arm AND g.restart = 0 AND g.prompt_index = t.prompt_index AND g.position = t.position
        WHERE g.margin = t.ref_margin""")
    assert margins == [{"n": 6 * 12}], "the teacher-forced margin equals the decoding margin bit for bit"


def test_kernel_evidence_rules() -> None:
    ok = kernel_evidence({"l0": {"int8-cutlass-order": 3}, "l1": {"int8-cutlass-order": 3}}, "int8-cutlass-order")
    assert ok == (["int8-cutlass-order"], True, None)
    wrong = kernel_evidence({"l0": {"int8-triton-order": 3}}, "int8-cutlass-order")
    assert not wrong[1] and "int8-triton-order" in wrong[2]
    silent = kernel_evidence({"l0": {"int8-cutlass-order": 1}, "l1": {}}, "int8-cutlass-order")
    assert not silent[1] and "never ran" in silent[2]


def test_teacher_forced_without_reference_fails_clearly(tmp_path: Path) -> None:
    from orchestrator.worker import UnitFiles
    from storage.store import open_store
    from tasks.kinds.teacher_forced import run

    params = {"reference": {"name": "a", "unit_id": "nope"}, "arm": {"name": "b"}}
    with pytest.raises(RuntimeError, match="has not finished"):
        run(params, UnitFiles(open_store(tmp_path), "s", "u"))


@pytest.mark.slow
def test_reports_on_real_generation_output(gen_results: Path) -> None:
    import json

    res = runner.invoke(app, ["report", "agreement", "--results", str(gen_results), "--format", "json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert {(r["arm"], r["identical"], r["total"]) for r in rep["self_reproducibility"]} == {
        ("cutlass-pow2", 6, 6), ("triton-pow2", 6, 6)}
    assert [(r["arm_a"], r["arm_b"], r["identical"], r["total"]) for r in rep["cross_arm"]] == [
        ("cutlass-pow2", "triton-pow2", 6, 6)]
    flips = runner.invoke(app, ["report", "flips", "--results", str(gen_results), "--format", "json"])
    assert flips.exit_code == 0, flips.output
    (f,) = json.loads(flips.stdout)["pairs"]
    assert f["positions"] == 6 * 12 and f["flips"] == 0 and f["auc"] is None and f["auc_ci"] is None
