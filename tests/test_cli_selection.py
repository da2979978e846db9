"""A CLI process builds only the command its command line names (orchestrator/cli/selection.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.selection import Wanted, wanted
from tests.conftest import REPO


@pytest.mark.parametrize(("argv", "want"), [
    ([], None),
    (["--help"], None),
    (["--version"], None),
    (["-q", "report", "noise-floor", "--results", "r"], Wanted("report", "noise-floor")),
    (["report", "noise-floor"], Wanted("report", "noise-floor")),
    (["report", "--help"], Wanted("report")),
    (["report"], Wanted("report")),
    (["sweep", "launch", "x.toml"], Wanted("sweep")),
    (["query", "SELECT 1"], Wanted("query")),
    (["nosuch", "report"], None),
    (["--results", "report"], None),  # an option the top level does not have: let click say so
])
def test_wanted_reads_the_command_line(argv: list[str], want: Wanted | None) -> None:
    assert wanted(argv) == want


def test_shell_completion_builds_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("_SWAPCHECK_COMPLETE", "bash_complete")
    assert wanted(["report", "noise-floor"]) is None


_PROBE = """
import json, sys
from orchestrator.cli import selection
selection.WANTED = selection.wanted(sys.argv[1:])
from orchestrator.cli.main import app
import typer.main
group = typer.main.get_command(app)
sub = group.commands.get("report")
print(json.dumps({"top": sorted(group.commands), "report": sorted(sub.commands) if sub else None,
                  "plugins_scanned": "importlib.metadata" in sys.modules,
                  "views": sorted(m for m in sys.modules if m.startswith("reports.views."))}))
"""


def _probe(*argv: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    return dict(json.loads(out.stdout))


def test_one_report_builds_that_report_alone() -> None:
    got = _probe("report", "noise-floor", "--results", "r")
    assert got["top"] == ["report", "version"]
    assert got["report"] == ["noise-floor"]
    assert got["views"] == ["reports.views.noise_floor"]
    assert got["plugins_scanned"] is False


def test_an_unknown_report_or_help_builds_every_report() -> None:
    every = _probe("report", "--help")
    assert every["top"] == ["report", "version"]
    assert isinstance(every["report"], list) and {"noise-floor", "certificate", "all"} <= set(every["report"])
    assert _probe("report", "nois-floor")["report"] == every["report"]  # click then says "did you mean"
    assert len(_probe()["top"]) == 11  # type: ignore[arg-type]


def test_the_program_runs_the_named_report() -> None:
    """Through ``python -m`` (as the tests and benchmarks run it): a wrong name still gets click's hint."""
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "report", "nois-floor"], cwd=REPO,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 2 and "noise-floor" in out.stderr


_RUN = """
import runpy, sys
sys.argv = ["swapcheck", *sys.argv[1:]]
try:
    runpy.run_module("orchestrator.cli.main", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print(f"exit={code} rich={'rich' in sys.modules} views={sorted(m for m in sys.modules if m.startswith('reports.views.'))}",
      file=sys.stderr)
"""


@pytest.mark.usefixtures("ledgered_writes")
def test_a_json_report_runs_without_rich_or_other_views(tmp_path: Path) -> None:
    """What the selection and the lazy consoles save: a report printed as JSON imports one view and no
    rich (orchestrator/cli/consoles.py); the same report as a table does import rich."""
    from tests.test_divergence import write_fixture

    root = tmp_path / "results"
    write_fixture(root)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for fmt, rich in (("json", False), ("table", True)):
        out = subprocess.run([sys.executable, "-c", _RUN, "report", "noise-floor", "--results", str(root), "--format", fmt],
                             cwd=REPO, capture_output=True, text=True, env=env)
        last = out.stderr.strip().splitlines()[-1]
        assert last == f"exit=0 rich={rich} views=['reports.views.noise_floor']", out.stderr[-2000:]
