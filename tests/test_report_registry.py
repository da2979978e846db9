"""Reports as registered views (reports.registry): the contract every report keeps, the generated CLI,
answers scoped to one sweep, and a report added from outside with one module and one SQL file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from reports.registry import Report, View, merge_json, report_registry, reports
from tests.conftest import REPO, launch_in_process, tiny_spec_text

SWEEPS = ("alpha", "beta")
UNITS = 6  #: units of the tiny spec with one seed (3 K values x 2 scale modes), each sweep's all "ok"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two sweeps of the same tiny K-depth spec (identical units, different sweep names): a report that
    pooled them would count every output twice."""
    root = tmp_path_factory.mktemp("registry") / "results"
    for name in SWEEPS:
        summary = launch_in_process(root, tiny_spec_text(name=name, seeds=1))
        assert summary.n_ok == summary.n_units == UNITS, summary.failures
    return root


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=300)


# -- the contract every registered report keeps ---------------------------------------------------------

@pytest.mark.parametrize("name", report_registry().names())
def test_every_report_keeps_the_contract(name: str, results: Path) -> None:
    from storage.catalog import open_catalog, query_names

    rep = report_registry().get(name)
    assert isinstance(rep, Report) and rep.name == name
    assert rep.question.endswith("?") or "?" in rep.question, "a report states the question it answers"
    assert rep.help.strip() and (not rep.example or rep.example.startswith(f"swapcheck report {name}"))
    assert rep.query in query_names() or (rep.sql_dir is not None and (rep.sql_dir / f"{rep.query}.sql").exists())
    with open_catalog(results) as cat:
        for sweep in SWEEPS:
            view = rep.view(cat, sweep)
            assert isinstance(view, View) and view.sweep == sweep
            rows = view.rows if isinstance(view.rows, list) else [r for rs in view.rows.values() for r in rs]
            assert {r["sweep"] for r in rows if isinstance(r, dict) and "sweep" in r} <= {sweep}, "scoped to its sweep"
            rep.sections(cat, sweep)


def test_unknown_report_gets_did_you_mean_and_exit_2() -> None:
    from orchestrator.errors import exit_code_for
    from reports.registry import ReportError

    with pytest.raises(ReportError, match="did you mean 'kdepth'") as exc:
        report_registry().get("kdeptj")
    assert exit_code_for(exc.value) == 2


def test_merge_json_puts_sweeps_side_by_side_and_never_sums() -> None:
    a = {"pairs": [{"sweep": "a", "n": 1}], "method": "exact", "n": 3}
    b = {"pairs": [{"sweep": "b", "n": 1}], "method": "exact", "n": 4}
    assert merge_json([a, b]) == {"pairs": [{"sweep": "a", "n": 1}, {"sweep": "b", "n": 1}], "method": "exact", "n": [3, 4]}
    assert merge_json([[1], [2]]) == [1, 2] and merge_json([a]) is a


def test_the_report_cli_is_generated_and_small() -> None:
    lines = len((REPO / "orchestrator" / "cli" / "report.py").read_text().splitlines())
    assert lines <= 272, "the report CLI is generic: at most a third of the 816 lines of nine hand-written modules"
    assert not list((REPO / "orchestrator" / "cli").glob("report_*.py"))


# -- scoped by construction -------------------------------------------------------------------------------

def test_kdepth_over_two_sweeps_equals_each_sweep_alone(results: Path) -> None:
    both = json.loads(_cli("report", "kdepth", "--results", str(results), "--format", "json").stdout)
    for sweep in SWEEPS:
        alone = json.loads(_cli("report", "kdepth", "--results", str(results), "--sweep", sweep, "--format", "json").stdout)
        assert alone and [r for r in both if r["sweep"] == sweep] == alone
    text = _cli("report", "kdepth", "--results", str(results)).stdout
    assert [line.split("sweep ")[1] for line in text.splitlines() if line.startswith("sweep ")] == list(SWEEPS)


@pytest.mark.slow  # default-suite budget (6 min on a clean clone); CI runs the slow set too
def test_report_all_shows_every_sweep_apart_with_the_counts_of_each_alone(results: Path) -> None:
    both = json.loads(_cli("report", "all", "--results", str(results), "--format", "json").stdout)
    assert both["sweeps"] == list(SWEEPS)
    assert {f["sweep"] for f in both["figures"]} == set(SWEEPS)
    assert len({f["title"] for f in both["figures"]}) == len(both["figures"]), "no two figures share a heading"
    for sweep in SWEEPS:
        alone = json.loads(_cli("report", "all", "--results", str(results), "--sweep", sweep, "--format", "json").stdout)
        mine = [t for t in both["tables"] if t["sweep"] == sweep]
        assert [t["rows"] for t in mine] == [t["rows"] for t in alone["tables"]]
        assert [r for r in both["certificate"]["rows"] if r["sweep"] == sweep] == alone["certificate"]["rows"]


# -- a report from outside: one module and one SQL file ------------------------------------------------------

TOY_MODULE = '''
"""A toy report: the units of a sweep per status."""

from pathlib import Path

from reports.registry import Block, Report, View, sql_rows


def _build(cat, sweep, opts):
    rows = sql_rows(cat, REPORT, sweep)
    return View(sweep, rows, [Block("toy: units per status", rows)])


def _metrics(cat, sweep):
    return {f"toy/{r['status']}": {"value": r["units"], "rule": "exact"} for r in sql_rows(cat, REPORT, sweep)}


REPORT = Report(name="toy", question="How many units of the sweep ended in each status?",
                help="Units per status (a toy report added with one module and one SQL file).",
                query="toy_units", build=_build, metrics=_metrics, sql_dir=Path(__file__).parent)
'''

TOY_SQL = """-- units per status of one sweep
SELECT sweep, status, count(*)::BIGINT AS units FROM units WHERE sweep = $sweep GROUP BY ALL ORDER BY status
"""


@pytest.fixture(scope="module")
def toy_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("toy")
    (root / "toy_report.py").write_text(textwrap.dedent(TOY_MODULE))
    (root / "toy_units.sql").write_text(TOY_SQL)
    info = root / "toy_report-0.1.dist-info"  # how an installed package declares its entry point
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-report\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[swapcheck.reports]\ntoy = toy_report:REPORT\n")
    return {"PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}


def test_a_toy_report_appears_in_help_its_command_report_all_and_the_nightly(results: Path, toy_env: dict[str, str]) -> None:
    assert "toy" in _cli("report", "--help", env={**toy_env, "COLUMNS": "200"}).stdout
    rows: list[dict[str, Any]] = json.loads(_cli("report", "toy", "--results", str(results), "--format", "json",
                                                  env=toy_env).stdout)
    assert rows == [{"sweep": s, "status": "ok", "units": UNITS} for s in SWEEPS]
    md = _cli("report", "toy", "--results", str(results), "--sweep", "beta", "--format", "markdown", env=toy_env).stdout
    assert "### toy: units per status" in md and f"| beta | ok | {UNITS} |" in md and "alpha" not in md
    doc = json.loads(_cli("report", "all", "--results", str(results), "--format", "json", env=toy_env).stdout)
    toy = [t for t in doc["tables"] if "toy: units per status" in t["title"]]
    assert [(t["sweep"], t["rows"]) for t in toy] == [(s, [{"sweep": s, "status": "ok", "units": UNITS}]) for s in SWEEPS]
    code = ("import json, sys; from storage.catalog import open_catalog; from reports.metrics import sweep_metrics\n"
            "with open_catalog(sys.argv[1]) as cat: print(json.dumps(sweep_metrics(cat, 'beta')))")
    nightly = subprocess.run([sys.executable, "-c", code, str(results)], cwd=REPO, capture_output=True, text=True,
                             env={**os.environ, **toy_env}, check=True)
    metrics = json.loads(nightly.stdout)
    assert metrics["toy/ok"] == {"value": UNITS, "rule": "exact"} and metrics["units/ok"]["value"] == UNITS, "the nightly too"


def test_reports_are_listed_in_one_order() -> None:
    names = [r.name for r in reports()]
    assert names[:3] == ["kdepth", "units", "replay"] and set(names) == set(report_registry().names())
