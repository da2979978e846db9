"""Tables that fit a terminal (issue #40): at ``COLUMNS=100`` and piped, no line is wider than the
width and no identifying cell (pair, arm, kernel, layer) is cut; piped output says once how to widen.

The reports are real: a small results tree shaped like ``make demo``'s (tests/_report_demo.py), with
the demo's four arm names whose pairs read the same when cut (``cutlass-…`` / ``triton-p…``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli.consoles import PIPE_WIDTH, WIDEN_HINT
from orchestrator.cli.main import app
from tests._report_demo import ARMS, SWEEP, demo_results

runner = CliRunner()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_results(tmp_path_factory)


@pytest.fixture(autouse=True)
def _hint_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each invocation is a fresh process to the once-per-process hint."""
    import orchestrator.cli.tables as tables

    monkeypatch.setattr(tables, "_hinted", False)


def _run(*args: str, columns: int | None) -> Any:
    env = {"COLUMNS": str(columns)} if columns else {"COLUMNS": ""}
    res = runner.invoke(app, list(args), env=env)
    assert res.exit_code == 0, res.output
    return res


def _json(*args: str) -> Any:
    return json.loads(_run(*args, "--format", "json", columns=None).stdout)


def _fits(text: str, width: int) -> None:
    wide = [line for line in text.splitlines() if len(line) > width]
    assert not wide, f"{len(wide)} lines wider than {width}:\n" + "\n".join(wide[:5])
    assert "…" not in text, "a cell was cut"


def _names(text: str) -> set[str]:
    """Every whole cell of the tables (between box borders) and every word of the rest."""
    cells = {c.strip() for line in text.splitlines() for c in line.replace("┃", "│").split("│")}
    return cells | set(text.split())


@pytest.mark.parametrize("columns", [100, None], ids=["COLUMNS=100", "piped"])
def test_divergence_names_every_arm_pair_whole(results: Path, columns: int | None) -> None:
    res = _run("report", "divergence", "--results", str(results), "--sweep", SWEEP, columns=columns)
    _fits(res.stdout, columns or PIPE_WIDTH)
    rep = _json("report", "divergence", "--results", str(results), "--sweep", SWEEP)
    pairs = [f"{p['arm_a']} vs {p['arm_b']}" for p in rep["first_divergence"]]
    assert len(pairs) == 6 and {a for p in rep["first_divergence"] for a in (p["arm_a"], p["arm_b"])} == set(ARMS)
    teacher = [f"{p['ref_arm']} -> {p['arm']}" for p in rep["distribution"]]
    assert teacher == ["cutlass -> triton", "cutlass-pow2 -> triton-pow2"]
    cells = _names(res.stdout)
    missing = [p for p in pairs + teacher if p not in cells]
    assert not missing, f"pairs not shown whole in one cell: {missing}"


@pytest.mark.parametrize("columns", [100, None], ids=["COLUMNS=100", "piped"])
def test_localize_names_every_pair_kernel_and_linear_whole(results: Path, columns: int | None) -> None:
    res = _run("report", "localize", "--results", str(results), "--sweep", SWEEP, columns=columns)
    _fits(res.stdout, columns or PIPE_WIDTH)
    rows = _json("report", "localize", "--results", str(results), "--sweep", SWEEP)
    assert rows and all(r["first_divergence"] is not None for r in rows)
    cells = _names(res.stdout)
    want = {"cutlass~triton", "int8-cutlass-order ~ int8-triton-order"}
    want |= {r["first_diff_linear"] for r in rows} | {name for r in rows for name in r["culprit"]}
    assert not want - cells, f"not shown whole in one cell: {want - cells}"
    if columns == 100:  # 16 columns do not fit in 100: the rest follow, each row named again
        assert "(continued, 2 of" in res.stdout and "each row named again" in res.stdout


@pytest.mark.parametrize("report", ["certificate", "conformance", "kdepth", "agreement", "flips"])
def test_other_reports_fit_a_pipe_and_100_columns(results: Path, report: str) -> None:
    for columns in (100, None):
        res = _run("report", report, "--results", str(results), "--sweep", SWEEP, columns=columns)
        _fits(res.stdout, columns or PIPE_WIDTH)
    assert "cutlass" in res.stdout, "the report showed its pairs"


def test_piped_output_says_once_how_to_widen(results: Path) -> None:
    res = _run("report", "localize", "--results", str(results), "--sweep", SWEEP, columns=None)
    assert res.stderr.count(WIDEN_HINT) == 1 and WIDEN_HINT not in res.stdout
    wide = _run("report", "localize", "--results", str(results), "--sweep", SWEEP, columns=400)
    assert WIDEN_HINT not in wide.stderr, "COLUMNS was set: nothing to say"
    assert "(continued" not in wide.stdout and max(len(line) for line in wide.stdout.splitlines()) > PIPE_WIDTH


def test_markdown_keeps_every_row_on_one_line(results: Path) -> None:
    res = _run("report", "localize", "--results", str(results), "--sweep", SWEEP, "--format", "markdown", columns=100)
    header = next(line for line in res.stdout.splitlines() if line.startswith("| experiment | pair (A~B) | kernels"))
    assert header.count("|") == 17, "the pair table's 16 columns on one line"


def test_fitted_tables_repeat_the_key_and_never_cut_it() -> None:
    """The rule alone: names too long for a shared table keep whole; other columns move on."""
    from rich.console import Console

    from orchestrator.cli.tables import fitted_tables

    console = Console(width=60, file=open("/dev/null", "w"), color_system=None)  # noqa: SIM115
    rows = [{"pair": f"kernel-with-a-long-name-{i} vs kernel-{i}", "arm": f"arm-{i}",
             **{f"figure {j}": f"value {i}.{j} with words" for j in range(6)}} for i in range(3)]
    fitted = fitted_tables(console, rows, 60, "t")
    tables = fitted.tables
    assert fitted.natural > 60
    assert len(tables) > 1
    for t in tables:
        assert [c.header for c in t.columns][:1] == ["pair"], "each table names the row by its pair"
        console.begin_capture()
        console.print(t)
        text = console.end_capture()
        assert max(len(line) for line in text.splitlines()) <= 60
        for r in rows:
            assert r["pair"] in text
    shown = [c.header for t in tables for c in t.columns if c.header not in ("pair", "arm")]
    assert shown == [f"figure {j}" for j in range(6)], "every other column exactly once, in order"
