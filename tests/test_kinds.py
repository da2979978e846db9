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
    assert kind_names() == ["attention_replay", "batch_invariance", "bounds", "exact_match", "fuzz", "generate", "kdepth", "localize", "precision", "quantize", "replay", "teacher_forced"]
    assert experiment_kinds() == ["attention_replay", "batch_invariance", "bounds", "exact_match", "fuzz", "generate", "kdepth", "localize", "precision", "quantize", "replay"]
    with pytest.raises(KindError, match="did you mean 'kdepth'"):
        get_kind("kdepht")
    with pytest.raises(KindError, match="already registered"):
        register_kind(dataclasses.replace(get_kind("kdepth")))


def test_an_unknown_kind_in_a_spec_names_the_field_and_the_choices() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec('question = "q"\nname = "x"\n[experiments.a]\nkind = "kdepht"\n')
    (problem,) = err.value.problems
    assert problem.startswith("experiments.a.kind: unknown experiment kind 'kdepht'; did you mean 'kdepth'?")
    assert "allowed: attention_replay, batch_invariance, bounds, exact_match, fuzz, generate, kdepth, localize, precision, quantize, replay" in problem
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


def _own_example(kind: Kind) -> Any:
    """The kind's own example (``Kind.example``), validated, resolved (relative paths as from a spec
    under sweeps/) and free of problems: what a spec holding it would pass."""
    assert kind.spec is not None and kind.example is not None
    exp = kind.resolve(kind.spec.model_validate(dict(kind.example)), lambda p: (REPO / "sweeps" / p).resolve())
    assert kind.problems(f"{kind.name}.example", exp) == [], f"{kind.name}: its example has problems"
    return exp


def check_kind_contract(kind: Kind, others: list[Kind]) -> None:
    """The contract every kind keeps, on its own example (``Kind.example``) and on every experiment of
    its kind under sweeps/ (at least one of them); a kind without a spec model (planned by another) on
    the units the examples of ``others`` plan for it."""
    name = kind.name
    assert get_kind(name) is kind
    assert kind.version and kind.doc.strip(), f"{name}: a version, and a doc (its module docstring)"
    assert kind.tables and all(t in TABLES for t in kind.tables), f"{name}: tables declared in storage.schemas"
    sweeps = _experiments_by_kind()
    if kind.spec is None:  # planned by another kind: its units come out of that kind's expand()
        assert kind.example is None, f"{name}: an example needs a spec model"
        planners = [(k, e) for k in others if k.spec is not None
                    for e in ([_own_example(k)] if k.example is not None else []) + [e for _, e in sweeps.get(k.name, [])]]
        units = [u for k, e in planners for u in k.expand("e", e) if u.kind == name]
    else:
        examples = ([(f"{name}.example", _own_example(kind))] if kind.example is not None else []) + sweeps.get(name, [])
        assert examples, f"kind {name!r}: no example to test (Kind.example, or a spec under sweeps/ using it)"
        units = []
        for where, exp in examples:
            # The spec model round-trips through plain data (what a TOML file holds).
            assert kind.spec.model_validate(exp.model_dump(mode="python")) == exp, where
            first, second = list(kind.expand("e", exp)), list(kind.expand("e", exp))
            assert [u.id for u in first] == [u.id for u in second], f"{where}: expand() is not deterministic"
            units += [u for u in first if u.kind == name]
    assert units, f"{name}: no example plans a unit of this kind"
    for u in units:
        assert u.id == unit_id(name, u.params)
        assert u.describe().strip()
        # VERSION feeds the unit id: a new version of the computation is new work.
        assert content_id(name, kind.version + "+1", u.params) != u.id
    json.dumps([u.params for u in units])  # parameters are plain JSON


@pytest.mark.parametrize("name", kind_names())
def test_every_kind_keeps_the_contract(name: str) -> None:
    check_kind_contract(get_kind(name), [get_kind(n) for n in kind_names()])


def test_the_kind_template_in_the_docs_keeps_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """The template of docs/architecture.md ("How to add an experiment kind"), copied verbatim into a
    module, registers and keeps the contract (with its table declared, as the doc says next)."""
    import re
    import sys
    import types

    doc = (REPO / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## How to add an experiment kind"):]
    source = re.search(r"```python\n(.*?)```", section, re.S)
    assert source and "# tasks/kinds/mykind.py" in source.group(1)
    module = types.ModuleType("mykind_from_the_docs")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(source.group(1), "docs/architecture.md", "exec"), module.__dict__)  # noqa: S102
    kind = module.KIND
    assert kind.doc.strip() == (module.__doc__ or "").strip() != ""
    monkeypatch.setitem(TABLES, "mykind", pa.schema([("unit_id", pa.string()), ("experiment", pa.string()),
                                                     ("size", pa.int64()), ("differing", pa.int64())]))
    register_kind(kind)
    try:
        check_kind_contract(kind, [kind])
        assert kind_ref("mykind") == "mykind_from_the_docs:KIND"
    finally:
        from tasks.kinds import unregister_kind

        unregister_kind("mykind")


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_sweep_spec_validates_and_plans(path: Path) -> None:
    res = runner.invoke(app, ["sweep", "validate", str(path)])
    assert res.exit_code == 0, res.output
    plan = make_plan(load_spec(path))
    assert plan.units and len({u.id for u in plan.units}) == len(plan.units)


def test_unit_ids_of_the_demo_sweep_are_pinned() -> None:
    """Results written before the kinds moved to tasks/kinds/ are still skipped on relaunch: every pinned
    unit is still planned, in the same order (experiments added to the demo since add units of their own)."""
    pinned = json.loads((REPO / "tests" / "data" / "demo_unit_ids.json").read_text())
    planned = [u.id for u in make_plan(load_spec(REPO / pinned["spec"])).units]
    assert [i for i in planned if i in set(pinned["unit_ids"])] == pinned["unit_ids"]
    # the batch-invariance experiment: one unit per kernel and output dtype (4 kernels x bf16, fp32 since issue #26)
    assert len(planned) - len(pinned["unit_ids"]) == 8


# -- rows as Arrow tables (issue #14: per-position rows never pass through one dict per row) -------

def test_a_kind_may_return_an_arrow_table_and_the_worker_adds_the_constant_columns(tmp_path: Path) -> None:
    from orchestrator.worker import execute_unit
    from storage.store import ResultStore

    def run(params: dict[str, Any], ctx: UnitContext | None) -> dict[str, Any]:
        xs = list(range(params["x"]))
        return {"toy": pa.table({"x": xs, "square": [x * x for x in xs]})}  # int64 columns, no note

    arrow_kind = dataclasses.replace(TOY, name="toy_arrow", run=run)
    register_kind(arrow_kind)
    try:
        payload = {**arrow_kind.unit("exp", {"x": 4, "note": "n"}).to_payload(), "kind_ref": None}
        out = execute_unit(payload, str(tmp_path), "s", "0" * 64)
    finally:
        from tasks.kinds import unregister_kind

        unregister_kind("toy_arrow")
    assert out["status"] == "ok" and out["rows"] == 4
    rows = ResultStore(tmp_path).read_unit("toy", "s", payload["id"])
    assert rows == [{"unit_id": payload["id"], "experiment": "exp", "x": x, "square": x * x, "note": None} for x in range(4)]
    assert ResultStore(tmp_path).ledger_records("s")[payload["id"]]["files"][0]["rows"] == 4


def test_unit_table_refuses_undeclared_columns_and_keeps_dict_rows_working() -> None:
    from orchestrator.worker import unit_table

    with pytest.raises(ValueError, match="undeclared columns"):
        unit_table("toy", pa.table({"x": [1], "surprise": [2]}), "u", "e")
    with pytest.raises(ValueError, match="undeclared columns"):
        unit_table("toy", [{"x": 1, "surprise": 2}], "u", "e")
    t = unit_table("toy", [{"x": 2, "square": 4}, {"x": 3, "note": "hi"}, {}], "u", "e")
    assert t.schema.equals(TOY_TABLE) and t.to_pylist() == [
        {"unit_id": "u", "experiment": "e", "x": 2, "square": 4, "note": None},
        {"unit_id": "u", "experiment": "e", "x": 3, "square": None, "note": "hi"},
        {"unit_id": "u", "experiment": "e", "x": None, "square": None, "note": None}]
    assert unit_table("toy", [], "u", "e").num_rows == 0 and unit_table("toy", pa.table({"x": pa.array([], pa.int64())}), "u", "e").num_rows == 0


def _teacher_forced_dict_rows(ref: str, arm: str, prompts: list[list[int]], generated: list[list[int]],
                              ref_scores: dict[str, Any], arm_scores: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows as teacher_forced built them before issue #14: one dict per generated position."""
    rows = []
    for i, prompt in enumerate(prompts):
        first = len(prompt) - 1
        for p, token in enumerate(generated[i]):
            j = first + p
            ra, aa = ref_scores["argmax"][i][j], arm_scores["argmax"][i][j]
            rows.append({"ref_arm": ref, "ref_restart": 0, "arm": arm, "prompt_index": i, "position": p, "ref_token": token,
                         "ref_argmax": ra, "ref_margin": ref_scores["margins"][i][j], "arm_argmax": aa,
                         "arm_margin": arm_scores["margins"][i][j], "flip": ra != aa})
    return rows


@pytest.mark.parametrize("as_arrays", [False, True], ids=["lists", "arrays"])
def test_teacher_forced_position_table_equals_the_rows_it_built_as_dicts(as_arrays: bool) -> None:
    import random

    import numpy as np

    from orchestrator.worker import unit_table
    from tasks.kinds.teacher_forced import position_table

    rng = random.Random(7)
    prompts = [[rng.randrange(50) for _ in range(rng.randint(1, 6))] for _ in range(5)]
    generated = [[rng.randrange(50) for _ in range(rng.randint(0, 9))] for _ in range(5)]
    scores = [{"argmax": [[rng.randrange(3) for _ in range(len(p) + len(g))] for p, g in zip(prompts, generated, strict=True)],
               "margins": [[rng.choice([0.0, float("inf"), rng.random()]) for _ in range(len(p) + len(g))]
                           for p, g in zip(prompts, generated, strict=True)]} for _ in range(2)]
    expected = unit_table("teacher_forced", _teacher_forced_dict_rows("a", "b", prompts, generated, *scores), "u", "e")
    conv = (lambda xs: [np.asarray(x) for x in xs]) if as_arrays else (lambda xs: xs)
    got = position_table("a", "b", conv(generated), conv(scores[0]["argmax"]), conv(scores[0]["margins"]),
                         conv(scores[1]["argmax"]), conv(scores[1]["margins"]), [len(p) - 1 for p in prompts])
    assert unit_table("teacher_forced", got, "u", "e").equals(expected)
    assert sum(r["flip"] for r in expected.to_pylist()) > 0  # the data has flips to compare
    with pytest.raises(ValueError, match="predictions for"):
        position_table("a", "b", generated, [s[:1] for s in scores[0]["argmax"]], scores[0]["margins"],
                       scores[1]["argmax"], scores[1]["margins"], [len(p) - 1 for p in prompts])
