"""CLI conventions: formats per command, unknown sweeps, --version, -o, plurals, full width when piped,
progress without a terminal, nightly paths and messages, each sweep of a report on its own, named queries.

Results are small and real: the tiny spec launched in-process (``launch_in_process``), no Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tests.conftest import REPO, launch_in_process, tiny_spec_text

cli = CliRunner()
SWEEPS = ("kdepth-demo", "kdepth-other")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("conventions") / "results"
    for name in SWEEPS:
        summary = launch_in_process(root, tiny_spec_text(name=name, seeds=1))
        assert summary.n_ok == summary.n_units, summary.failures
    return root


def _invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return cli.invoke(app, list(args), env=env)


# -- formats -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["report", "kdepth"], ["report", "units"], ["report", "replay"],
                                     ["report", "agreement"], ["report", "conformance"], ["report", "predictions"],
                                     ["query", "SELECT 1"], ["kernels", "list"], ["sweep", "verify"]])
def test_table_readers_refuse_html_and_write_json(command: list[str], results: Path) -> None:
    refused = _invoke(*command, "--results", str(results), "--format", "html") if command[0] != "kernels" else \
        _invoke(*command, "--format", "html")
    assert refused.exit_code == 2 and "html" in refused.output
    res = _invoke(*command, *(["--results", str(results)] if command[0] != "kernels" else []), "--format", "json")
    assert res.exit_code in (0, 1), res.output  # predictions: 0; verify: 0 (clean)
    json.loads(res.stdout)


@pytest.mark.slow  # default-suite budget (6 min on a clean clone); CI runs the slow set too
def test_report_all_offers_documents_only(results: Path, tmp_path: Path) -> None:
    assert _invoke("report", "all", "--results", str(results), "--format", "table").exit_code == 2
    for flag in ("-o", "--output", "--out"):
        target = tmp_path / f"report{flag.strip('-')}.md"
        res = _invoke("report", "all", "--results", str(results), "--format", "markdown", flag, str(target))
        assert res.exit_code == 0, res.output
        assert target.read_text().strip()


def test_numerics_demo_json() -> None:
    res = _invoke("numerics", "demo", "--format", "json")
    assert res.exit_code == 0 and json.loads(res.stdout)["sequential"] == [[256.0]]


# -- unknown sweeps --------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["report", "kdepth"], ["report", "units"], ["report", "replay"],
                                     ["report", "agreement"], ["report", "flips"], ["report", "conformance"],
                                     ["report", "predictions"], ["report", "all"],
                                     ["query", "--named", "kdepth_summary", "--param"]])
def test_unknown_sweep_exits_2_listing_the_sweeps(command: list[str], results: Path) -> None:
    sweep = ["sweep=nosuch"] if command[-1] == "--param" else ["--sweep", "nosuch"]
    res = _invoke(*command, *sweep, "--results", str(results), "--format", "json")
    assert res.exit_code == 2, res.output
    assert "nosuch" in res.output and all(s in res.output for s in SWEEPS)


def test_known_sweep_still_reads(results: Path) -> None:
    res = _invoke("report", "kdepth", "--sweep", SWEEPS[0], "--results", str(results), "--format", "json")
    assert res.exit_code == 0 and {r["sweep"] for r in json.loads(res.stdout)} == {SWEEPS[0]}


# -- version, completion, quiet/verbose ------------------------------------------------------------------

def test_version_flag_and_command() -> None:
    from importlib.metadata import version

    assert _invoke("--version").stdout.strip() == version("swapcheck")
    assert _invoke("version").stdout.strip() == version("swapcheck")


def test_completion_and_global_options_in_help() -> None:
    res = _invoke("--help", env={"COLUMNS": "200"})
    for flag in ("--install-completion", "--show-completion", "--quiet", "--verbose", "--version", "NO_COLOR"):
        assert flag in res.output


def test_quiet_keeps_results_and_drops_notes(results: Path, tmp_path: Path) -> None:
    target = tmp_path / "k.json"
    loud = _invoke("report", "kdepth", "--results", str(results), "--format", "json", "-o", str(target))
    assert loud.exit_code == 0 and f"wrote {target}" in loud.stderr
    quiet = _invoke("-q", "report", "kdepth", "--results", str(results), "--format", "json", "-o", str(target))
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert json.loads(target.read_text())
    assert _invoke("-q", "-v", "version").exit_code == 2


# -- output: -o, plurals, width, colour ------------------------------------------------------------------

def test_output_option_writes_the_file(results: Path, tmp_path: Path) -> None:
    target = tmp_path / "units.csv"
    res = _invoke("report", "units", "--results", str(results), "--format", "csv", "--output", str(target))
    assert res.exit_code == 0 and res.stdout == ""
    assert target.read_text().startswith("sweep,")


def test_plurals() -> None:
    from orchestrator.cli.common import plural

    assert [plural(n, "unit") for n in (0, 1, 2)] == ["0 units", "1 unit", "2 units"]


def test_validate_says_1_unit_not_1_units(tmp_path: Path) -> None:
    spec = tmp_path / "one.toml"
    spec.write_text(tiny_spec_text(name="one", seeds=1).replace("k = { start = 32, stop = 128, factor = 2 }", "k = [32]")
                    .replace('scale_modes = ["real", "pow2"]', 'scale_modes = ["real"]'))
    res = _invoke("sweep", "validate", str(spec))
    assert res.exit_code == 0, res.output
    assert "1 experiment, 1 unit" in res.output


def _cli_to_file(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    target = tmp_path / "stdout.txt"
    clean = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    with open(target, "w") as fh:
        subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=REPO, stdout=fh,
                       stderr=subprocess.PIPE, env={**clean, **(env or {})}, check=True, timeout=120)
    return target.read_text()


def test_full_width_when_stdout_is_a_file(results: Path, tmp_path: Path) -> None:
    text = _cli_to_file(tmp_path, "report", "units", "--results", str(results))
    assert "kdepth-demo" in text and "kdepth-other" in text and "…" not in text
    text = _cli_to_file(tmp_path, "report", "kdepth", "--results", str(results), "--long")
    assert "int8-cutlass-order" in text and "int8-triton-order" in text and "…" not in text
    assert "\x1b[" not in text  # no colour in a file


def test_no_color_is_honoured(results: Path) -> None:
    def stderr(**env: str) -> str:
        clean = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
        return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "report", "kdepth", "--results", str(results),
                               "--sweep", "nosuch"], cwd=REPO, capture_output=True, text=True, env={**clean, **env},
                              timeout=120).stderr

    assert "\x1b[1;31m" in stderr(FORCE_COLOR="1")  # the red "error:" on a (forced) terminal
    plain = stderr(FORCE_COLOR="1", NO_COLOR="1")
    assert "--sweep nosuch" in plain and "31m" not in plain  # bold stays: NO_COLOR is about colour


# -- progress without a terminal -------------------------------------------------------------------------

class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class _Unit:
    def describe(self) -> str:
        return "kdepth int8 k=32"


def test_progress_lines_when_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli.progress import UnitProgress

    clock = _Clock()
    progress = UnitProgress("sweep s", clock=clock, seconds=10.0)
    progress("start", {"total": 25, "skipped": 5, "pending": 20})
    for i in range(20):
        clock.t += 1.0
        status = "failed" if i == 3 else "ok"
        progress("unit", {"unit": _Unit(), "result": {"status": status, "error": "boom\nmore"}})
    progress("end", {})
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "sweep s: 25 units, 5 already done, 20 to run"
    assert "failed kdepth int8 k=32: boom" in err
    lines = [line for line in err if " units done, " in line]
    assert len(lines) == 10  # every tenth of the units (2 of 20)
    assert lines[0] == "sweep s: 2/20 units done, 0 failed, 1.00 units/s, ETA 18 s"
    assert lines[-1].startswith("sweep s: 20/20 units done, 1 failed, 1.00 units/s, ETA 0 s")


def test_progress_every_ten_seconds_when_units_are_slow(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli.progress import UnitProgress

    clock = _Clock()
    progress = UnitProgress("sweep s", clock=clock, seconds=10.0)
    progress("start", {"total": 1000, "skipped": 0, "pending": 1000})
    for _ in range(3):
        clock.t += 11.0
        progress("unit", {"unit": _Unit(), "result": {"status": "ok"}})
    lines = [line for line in capsys.readouterr().err.splitlines() if " units done, " in line]
    assert [line.split(":")[1].split(" done")[0].strip() for line in lines] == ["1/1000 units", "2/1000 units", "3/1000 units"]


# -- nightly: paths, progress, the first baseline --------------------------------------------------------

@pytest.mark.slow  # default-suite budget (6 min on a clean clone); CI runs the slow set too
def test_nightly_paths_progress_and_baseline_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.runner

    real = orchestrator.runner.launch

    def launch_here(spec: Any, results: Any, address: Any = None, num_cpus: Any = None, **kw: Any) -> Any:
        """The real launch as nightly calls it, in this process (no Ray): the same records and events."""
        assert address is None
        return real(spec, results, num_cpus=num_cpus, in_process=True, **kw)

    monkeypatch.setattr(orchestrator.runner, "launch", launch_here)
    suite, baseline, results = tmp_path / "nightly.toml", tmp_path / "baseline.json", tmp_path / "results"
    suite.write_text(tiny_spec_text(name="nightly", seeds=1))
    first = _invoke("nightly", str(suite), "--baseline", str(baseline), "--results", str(results), "--update-baseline")
    assert first.exit_code == 0, first.output
    assert "baseline created with" in first.stdout and "changed since the baseline" not in first.stdout
    assert "launching" in first.stderr and "6/6 units done" in first.stderr  # progress without a terminal
    (report_dir,) = (results / "nightly").iterdir()
    assert report_dir.name.startswith("nightly-") and (report_dir / "report.json").exists()
    assert not (results / "nightly" / "nightly").exists()
    assert json.loads((report_dir / "report.json").read_text())["baseline_created"] is True

    second = _invoke("-q", "nightly", str(suite), "--baseline", str(baseline), "--results", str(results))
    assert second.exit_code == 0, second.output
    assert "no regression; 0 metrics changed since the baseline, 0 metrics since nightly-" in second.stdout
    assert second.stderr == ""  # -q: no progress
    assert len(list((results / "nightly").iterdir())) == 2


def test_nightly_docs_give_the_results_root() -> None:
    docs = (REPO / "docs" / "nightly.md").read_text()
    assert "--results results --update-baseline" in docs and "--results results/nightly --" not in docs
    assert "results/nightly/<sweep>/" in docs


# -- replay: one section per sweep ----------------------------------------------------------------------------

def _replay_rows(sweep: str) -> dict[str, Any]:
    return {"sweep": sweep, "comparison": "pair", "impl_a": "a", "impl_b": "b", "scale_mode": "real", "layer": "l0.q",
            "layer_type": "q", "layers": 1, "identical_layers": 1, "elements": 10, "differing": 0, "frac_differing": 0.0,
            "max_spacing": 0, "bitwise_equal": True, "accumulators_equal": True}


def test_replay_shows_each_sweep_on_its_own(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from reports import replay

    rows = [_replay_rows(s) for s in SWEEPS]
    monkeypatch.setattr(replay, "by_layer", lambda cat, sweep: [r for r in rows if sweep in (None, r["sweep"])])
    monkeypatch.setattr(replay, "by_type", lambda cat, sweep: [r for r in rows if sweep in (None, r["sweep"])])
    both = _invoke("report", "replay", "--results", str(results), "--format", "markdown")
    assert both.exit_code == 0, both.output
    chapters = both.stdout.split("# sweep ")[1:]
    assert [c.splitlines()[0] for c in chapters] == list(SWEEPS)
    assert all(c.count("### replay by layer type") == 1 and c.count("| a vs b | real |") == 2 for c in chapters)
    one = _invoke("report", "replay", "--results", str(results), "--sweep", SWEEPS[0], "--format", "markdown")
    assert "# sweep" not in one.stdout and one.stdout.strip() == chapters[0].split("\n", 1)[1].strip()
    data = json.loads(_invoke("report", "replay", "--results", str(results), "--format", "json").stdout)
    assert [r["sweep"] for r in data] == list(SWEEPS)


# -- named queries ---------------------------------------------------------------------------------------

def test_query_list_names_the_queries_without_templates() -> None:
    res = _invoke("query", "--list", "--format", "json")
    listed = {q["name"]: q for q in json.loads(res.stdout)}
    assert "kdepth_summary" in listed and not any(n.startswith("prediction_") for n in listed)
    assert listed["kdepth_summary"]["summary"].startswith("K-depth table")
    assert listed["flip_positions"]["parameters"] == "sweep, ref_arm, arm"


def test_query_named_binds_params(results: Path) -> None:
    every = json.loads(_invoke("query", "--named", "kdepth_summary", "--results", str(results), "--format", "json").stdout)
    one = _invoke("query", "--named", "kdepth_summary", "--param", f"sweep={SWEEPS[1]}", "--results", str(results),
                  "--format", "json")
    assert one.exit_code == 0, one.output
    rows = json.loads(one.stdout)
    assert rows and {r["sweep"] for r in rows} == {SWEEPS[1]} and len(every) == 2 * len(rows)
    assert _invoke("query", "--named", "nosuch", "--results", str(results)).exit_code == 2
    bad = _invoke("query", "--named", "kdepth_summary", "--param", "arm=x", "--results", str(results))
    assert bad.exit_code == 2 and "$sweep" in bad.output


def test_catalog_views_have_no_table_column(results: Path) -> None:
    res = _invoke("query", "DESCRIBE kdepth", "--results", str(results), "--format", "json")
    names = [r["column_name"] for r in json.loads(res.stdout)]
    assert "sweep" in names and "table" not in names
