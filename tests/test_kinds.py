"""The kinds registry and the contract every kind keeps; a kind defined here runs end to end.

``TOY`` below is a whole experiment kind defined only in this module: registered through the same
registry as the built-in kinds (and its table through ``storage.schemas.register_table``), it
validates, plans, runs on a real embedded Ray instance, writes Parquet and is queryable — nothing
else in the code base knows about it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pytest
from pydantic import Field
from typer.testing import CliRunner

from orchestrator.cli.main import app
from orchestrator.errors import SpecError
from orchestrator.plan import make_plan
from orchestrator.spec import load_spec, parse_spec
from storage.catalog import read_only_query
from storage.schemas import TABLES, register_table
from tasks.kinds import (
    Kind,
    KindError,
    experiment_kinds,
    get_kind,
    kind_names,
    kind_ref,
    register_kind,
    unit_id,
)
from tasks.kinds.base import UnitContext, content_id
from tasks.kinds.fields import Strict
from tests.conftest import REPO

runner = CliRunner()
SWEEPS = sorted((REPO / "sweeps").glob("*.toml"))

# -- a kind that lives only in this test module ---------------------------------------------------

TOY_TABLE = pa.schema([("unit_id", pa.string()), ("experiment", pa.string()), ("x", pa.int64()),
                       ("square", pa.int64()), ("note", pa.string())])
register_table("toy", TOY_TABLE)


class ToyExperiment(Strict):
    """Squares of a few integers, one unit per integer."""

    kind: Literal["toy"]
    xs: list[int] = Field(min_length=1)
    note: str = "hello"


def _toy_problems(base: str, exp: ToyExperiment) -> list[str]:
    return [f"{base}.xs[{i}]: must be >= 0, got {x}" for i, x in enumerate(exp.xs) if x < 0]


def _toy_expand(experiment: str, exp: ToyExperiment) -> list[Any]:
    return [TOY.unit(experiment, {"x": x, "note": exp.note}) for x in exp.xs]


def _toy_run(params: dict[str, Any], ctx: UnitContext | None) -> dict[str, list[dict[str, Any]]]:
    if ctx is not None:
        ctx.put_artifact("toy.txt", f"{params['x']}".encode())
    return {"toy": [{"x": params["x"], "square": params["x"] ** 2, "note": params["note"]}]}


TOY = Kind(name="toy", version="1", spec=ToyExperiment, tables=("toy",), describe=lambda p: f"toy x={p['x']}",
           run=_toy_run, expand=_toy_expand, problems=_toy_problems)

TOY_SPEC = """
question = "Does the toy kind square?"
name = "toy-sweep"

[experiments.sq]
kind = "toy"
xs = [1, 2, 3, 12]
"""


@pytest.fixture
def toy_kind():
    # The lazy form of an entry ("module:attr"), importable by the Ray worker processes too.
    register_kind("tests.test_kinds:TOY", name="toy")
    yield get_kind("toy")
    from tasks.kinds import unregister_kind

    unregister_kind("toy")


def test_a_kind_defined_in_a_test_validates_plans_runs_on_ray_and_is_queryable(ray_local, toy_kind, tmp_path: Path) -> None:
    spec = tmp_path / "toy.toml"
    spec.write_text(TOY_SPEC)
    plan = make_plan(load_spec(spec))
    assert [u.describe() for u in plan.units] == ["toy x=1", "toy x=2", "toy x=3", "toy x=12"]
    assert kind_ref("toy") == "tests.test_kinds:TOY"  # how the Ray worker processes find it

    results = tmp_path / "results"
    res = runner.invoke(app, ["sweep", "launch", str(spec), "--results", str(results), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "4 ok, 0 failed" in res.output
    assert len(list((results / "table=toy" / "sweep=toy-sweep").glob("*.parquet"))) == 4
    rows = read_only_query(results, "SELECT x, square, note FROM toy ORDER BY x").to_pylist()
    assert rows == [{"x": x, "square": x * x, "note": "hello"} for x in (1, 2, 3, 12)]
    ledger = read_only_query(results, "SELECT kind, status, tables FROM units").to_pylist()
    assert {(r["kind"], r["status"], tuple(r["tables"])) for r in ledger} == {("toy", "ok", ("toy",))}
    artifacts = sorted(p.read_text() for p in (results / "_artifacts").rglob("toy.txt"))
    assert artifacts == ["1", "12", "2", "3"]
    q = runner.invoke(app, ["query", "SELECT sum(square)::BIGINT AS s FROM toy", "--results", str(results), "--format", "json"])
    assert q.exit_code == 0 and json.loads(q.stdout) == [{"s": 158}]


def test_toy_kind_problems_and_unknown_keys_are_spec_errors(toy_kind) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(TOY_SPEC.replace("[1, 2, 3, 12]", "[1, -2]"))
    assert err.value.problems == ["experiments.sq.xs[1]: must be >= 0, got -2"]
    with pytest.raises(SpecError) as err:
        parse_spec(TOY_SPEC + 'colour = "red"\n')
    assert err.value.problems == ["experiments.sq.colour: unknown key (got 'red')"]


def test_a_kind_that_writes_an_undeclared_table_fails_its_unit(tmp_path: Path) -> None:
    from orchestrator.worker import execute_unit

    rogue = dataclasses.replace(TOY, name="rogue", tables=("kdepth",))
    register_kind(rogue)
    try:
        payload = {**rogue.unit("e", {"x": 2, "note": "n"}).to_payload(), "kind_ref": None}
        out = execute_unit(payload, str(tmp_path), "s", "0" * 64)
    finally:
        from tasks.kinds import unregister_kind

        unregister_kind("rogue")
    assert out["status"] == "failed" and "does not declare" in out["error"]
    assert not (tmp_path / "table=toy").exists()


# -- the registry ---------------------------------------------------------------------------------

def test_registry_lists_every_kind_once_and_answers_unknown_names() -> None:
    assert kind_names() == ["bounds", "exact_match", "generate", "kdepth", "replay", "teacher_forced"]
    assert experiment_kinds() == ["bounds", "exact_match", "generate", "kdepth", "replay"]
    with pytest.raises(KindError, match="did you mean 'kdepth'"):
        get_kind("kdepht")
    with pytest.raises(KindError, match="already registered"):
        register_kind(dataclasses.replace(get_kind("kdepth")))


def test_an_unknown_kind_in_a_spec_names_the_field_and_the_choices() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec('question = "q"\nname = "x"\n[experiments.a]\nkind = "kdepht"\n')
    (problem,) = err.value.problems
    assert problem.startswith("experiments.a.kind: unknown experiment kind 'kdepht'; did you mean 'kdepth'?")
    assert "allowed: bounds, exact_match, generate, kdepth, replay" in problem
    with pytest.raises(SpecError, match="unknown experiment kind 'teacher_forced'"):
        parse_spec('question = "q"\nname = "x"\n[experiments.a]\nkind = "teacher_forced"\n')


# -- the contract, over every registered kind -----------------------------------------------------

def _experiments_by_kind() -> dict[str, list[tuple[str, Any]]]:
    """Every experiment of every spec under sweeps/, by kind."""
    found: dict[str, list[tuple[str, Any]]] = {}
    for path in SWEEPS:
        for name, exp in load_spec(path).experiments.items():
            found.setdefault(exp.kind, []).append((f"{path.name}:{name}", exp))
    return found


@pytest.mark.parametrize("name", ["bounds", "exact_match", "generate", "kdepth", "replay", "teacher_forced"])
def test_every_kind_keeps_the_contract(name: str) -> None:
    kind = get_kind(name)
    assert kind.name == name and kind.version and kind.doc.strip()
    assert kind.tables and all(t in TABLES for t in kind.tables)
    if kind.spec is None:  # planned by another kind: its units come out of that kind's expand()
        units = [u for exps in _experiments_by_kind().values() for _, e in exps
                 for u in get_kind(e.kind).expand("e", e) if u.kind == name]
    else:
        examples = _experiments_by_kind().get(name, [])
        assert examples, f"no spec under sweeps/ uses kind {name!r}"
        units = []
        for where, exp in examples:
            # The spec model round-trips through plain data (what a TOML file holds).
            assert kind.spec.model_validate(exp.model_dump(mode="python")) == exp, where
            first, second = kind.expand("e", exp), kind.expand("e", exp)
            assert [u.id for u in first] == [u.id for u in second], f"{where}: expand() is not deterministic"
            units += [u for u in first if u.kind == name]
    assert units
    for u in units:
        assert u.id == unit_id(name, u.params)
        assert u.describe().strip()
        # VERSION feeds the unit id: a new version of the computation is new work.
        assert content_id(name, kind.version + "+1", u.params) != u.id
    json.dumps([u.params for u in units])  # parameters are plain JSON


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_sweep_spec_validates_and_plans(path: Path) -> None:
    res = runner.invoke(app, ["sweep", "validate", str(path)])
    assert res.exit_code == 0, res.output
    plan = make_plan(load_spec(path))
    assert plan.units and len({u.id for u in plan.units}) == len(plan.units)


def test_unit_ids_of_the_demo_sweep_are_pinned() -> None:
    """Results written before the kinds moved to tasks/kinds/ are still skipped on relaunch."""
    pinned = json.loads((REPO / "tests" / "data" / "demo_unit_ids.json").read_text())
    assert [u.id for u in make_plan(load_spec(REPO / pinned["spec"])).units] == pinned["unit_ids"]
