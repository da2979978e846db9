"""`swapcheck sweep plan` prints the expected GPU time on one H200 (issue #37), from measured per-unit
costs where they exist and stated assumptions where they do not; the paper's protocol at 1.7B
(sweeps/paper-qwen3-1_7b.toml) is planned under the 30-minute goal."""

from __future__ import annotations

from typer.testing import CliRunner

from orchestrator.cli.main import app
from orchestrator.gpu_time import ASSUMPTIONS, estimate
from orchestrator.plan import make_plan
from orchestrator.spec import load_spec
from tests.conftest import REPO

runner = CliRunner()


def test_the_paper_protocol_at_1_7b_is_planned_under_thirty_minutes_with_its_terms_said() -> None:
    plan = make_plan(load_spec(REPO / "sweeps" / "paper-qwen3-1_7b.toml"))
    est = estimate(plan)
    kinds = {u.kind for u in plan.units}
    assert kinds == {"generate", "teacher_forced", "replay", "kdepth"} and est.units == len(plan.units)
    assert 0 < est.seconds < 30 * 60, est.seconds
    # the sum is the sum of its experiments, and each term printed says whether it is measured or assumed
    assert abs(sum(est.per_experiment.values()) - est.seconds) < 1e-6
    lines = est.lines()
    assert lines[0].startswith(f"expected GPU time on one H200: {est.seconds / 60:.1f} min for {est.units} GPU unit(s)")
    for term in est.terms:
        kind = ASSUMPTIONS[term][1]
        assert any(line.strip().startswith(f"{kind} {term} = ") or line.strip().startswith(f"{kind}  {term} = ")
                   for line in lines), term
    assert any(line.strip().startswith("measured kdepth_cpu_s_per_gmac") for line in lines)


def test_sweep_plan_prints_it_and_a_cpu_only_spec_prints_none() -> None:
    res = runner.invoke(app, ["sweep", "plan", str(REPO / "sweeps" / "paper-qwen3-1_7b.toml")])
    assert res.exit_code == 0 and "expected GPU time on one H200" in res.stderr, res.output
    assert "assumed  engine_start_s = 60" in res.stderr
    cpu = runner.invoke(app, ["sweep", "plan", str(REPO / "sweeps" / "kdepth-demo.toml")])
    assert cpu.exit_code == 0 and "expected GPU time" not in cpu.stderr
    json_out = runner.invoke(app, ["sweep", "plan", str(REPO / "sweeps" / "paper-qwen3-1_7b.toml"), "--format", "json"])
    assert json_out.exit_code == 0 and "expected GPU time" not in json_out.stdout  # JSON stays the unit rows


def test_every_generate_unit_pays_an_engine_start() -> None:
    plan = make_plan(load_spec(REPO / "sweeps" / "paper-qwen3-1_7b.toml"))
    gen = [u for u in plan.units if u.kind == "generate"]
    est = estimate(plan)
    assert len(gen) == 6 and est.per_experiment["e2e"] >= (len(gen) + 1) * ASSUMPTIONS["engine_start_s"][0]
