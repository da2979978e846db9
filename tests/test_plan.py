"""The planner: deterministic, content-addressed unit ids."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from orchestrator.cli.main import app
from orchestrator.plan import make_plan, unit_id
from orchestrator.spec import load_spec, parse_spec
from tests.conftest import REPO, tiny_spec_text


def test_demo_plan_size_and_axes() -> None:
    plan = make_plan(load_spec(REPO / "sweeps" / "kdepth-demo.toml"))
    kinds = {(u.params["dtype"], u.params["scale_mode"]) for u in plan.units}
    assert kinds == {("int8", "real"), ("int8", "pow2"), ("fp8_e4m3", "real")}
    assert len(plan.units) == 7 * 16 * 2 + 7 * 4
    assert len({u.id for u in plan.units}) == len(plan.units)


def test_ids_are_deterministic_across_processes() -> None:
    ids = [u.id for u in make_plan(parse_spec(tiny_spec_text())).units]
    code = (
        "from orchestrator.plan import make_plan; from orchestrator.spec import parse_spec;"
        "from tests.conftest import tiny_spec_text;"
        "print(' '.join(u.id for u in make_plan(parse_spec(tiny_spec_text())).units))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert other.stdout.split() == ids


def test_ids_ignore_sweep_name_and_comments_but_not_parameters() -> None:
    base = {u.id for u in make_plan(parse_spec(tiny_spec_text())).units}
    renamed = {u.id for u in make_plan(parse_spec("# a comment\n" + tiny_spec_text(name="other"))).units}
    assert base == renamed
    changed = {u.id for u in make_plan(parse_spec(tiny_spec_text().replace("n = 24", "n = 32"))).units}
    assert base.isdisjoint(changed)


def test_unit_id_depends_on_kernel_params() -> None:
    a = unit_id("kdepth", {"implementations": [{"kernel": "int8-triton-order", "params": {"bias_mode": "fp32"}}]})
    b = unit_id("kdepth", {"implementations": [{"kernel": "int8-triton-order", "params": {"bias_mode": "output"}}]})
    assert a != b and len(a) == 20


def test_plan_cli_lists_units_as_json(tiny_spec) -> None:
    res = CliRunner().invoke(app, ["sweep", "plan", str(tiny_spec), "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == 3 * 2 * 2  # K x seeds x scale modes
    assert {r["kind"] for r in rows} == {"kdepth"}
    assert rows[0]["unit"].startswith("int8 M=16 N=24 K=32 seed=0")
