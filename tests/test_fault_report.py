"""tools/fault_report.py: the fault suite's tally is pytest's own outcomes plus the measured records."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("fault_report", ROOT / "tools" / "fault_report.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tally_counts_pytest_outcomes_and_sums_the_records(tmp_path: Path) -> None:
    tests = tmp_path / "test_mini.py"
    tests.write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('x', [1, 2, 3])\n"
        "def test_ok(x): assert x\n"
        "def test_bad(): assert False\n"
        "@pytest.mark.skip(reason='n/a')\n"
        "def test_skip(): pass\n")
    xml = tmp_path / "j.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                    f"--junitxml={xml}", str(tests), "--rootdir", str(tmp_path)], cwd=tmp_path, capture_output=True)
    fr = _tool()
    cases = fr.junit_cases(xml)
    assert sorted(c["outcome"] for c in cases) == ["failed", "passed", "passed", "passed", "skipped"]
    records = [{"case": "tests/faults/test_mini.py::test_ok[1]", "lost": 0, "duplicated": 2, "silent_wrong": 0},
               {"case": "tests/faults/test_mini.py::test_ok[2]", "lost": 1, "duplicated": 0, "silent_wrong": 1}]
    t = fr.tally(cases, records)
    assert t["modules"]["test_mini"] == {"cases": 5, "clean": 3, "failed": 1, "error": 0, "skipped": 1,
                                         "measured": 2, "lost": 1, "duplicated": 2, "silent_wrong": 1}
    assert t["total"] == t["modules"]["test_mini"]
    md = fr.markdown(t)
    assert "| `test_mini` | 5 | 3 | 1 | 1 | 2 | 1 | 2 | 1 |" in md
    assert json.loads(json.dumps(t)) == t
