"""Run the fault suite (tests/faults, slow cases included) and tally it: the table of docs/reliability.md.

    .venv/bin/python tools/fault_report.py [--workers 2] [--json out.json] [-- extra pytest args]

Cases tried and clean come from pytest's own JUnit XML (every collected case of tests/faults: each
parametrized case is one fault); lost, duplicated and silent-wrong from the records the measuring
tests write through the ``fault_outcome`` fixture (tests/faults/conftest.py), each counted from the
tree the fault left behind. Prints a Markdown table per test module and the totals; exits 1 when a
case failed or any record counts a loss, a duplicate or a silent wrong answer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _module(case: str) -> str:
    """``tests/faults/test_x.py::test_y[p]`` or JUnit's ``tests.faults.test_x`` -> ``test_x``."""
    head = case.split("::", 1)[0]
    return head.rsplit("/", 1)[-1].removesuffix(".py").rsplit(".", 1)[-1]


def junit_cases(xml: Path) -> list[dict[str, str]]:
    """One dict per test case: module, name, outcome (passed, failed, error, skipped)."""
    out = []
    for tc in ET.parse(xml).getroot().iter("testcase"):
        outcome = "passed"
        for child in tc:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
        out.append({"module": _module(tc.get("classname", "")), "name": tc.get("name", ""), "outcome": outcome})
    return out


def tally(cases: list[dict[str, str]], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per module and in total: cases, clean (passed), failed, skipped; measured records and their sums."""
    rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for c in cases:
        r = rows[c["module"]]
        r["cases"] += 1
        r["clean" if c["outcome"] == "passed" else c["outcome"]] += 1
    for rec in records:
        r = rows[_module(rec["case"])]
        r["measured"] += 1
        for k in ("lost", "duplicated", "silent_wrong"):
            r[k] += int(rec[k])
    keys = ("cases", "clean", "failed", "error", "skipped", "measured", "lost", "duplicated", "silent_wrong")
    table = {m: {k: int(r.get(k, 0)) for k in keys} for m, r in sorted(rows.items())}
    total = {k: sum(r[k] for r in table.values()) for k in keys}
    return {"modules": table, "total": total}


def markdown(t: dict[str, Any]) -> str:
    head = ("| module | cases | clean | failed | skipped | measured | rows lost | rows duplicated | silent wrong |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

    def line(name: str, r: dict[str, int]) -> str:
        return (f"| {name} | {r['cases']} | {r['clean']} | {r['failed'] + r['error']} | {r['skipped']} | "
                f"{r['measured']} | {r['lost']} | {r['duplicated']} | {r['silent_wrong']} |")

    return "\n".join([head, *(line(f"`{m}`", r) for m, r in t["modules"].items()), line("**total**", t["total"])])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (default 2)")
    ap.add_argument("--json", type=Path, help="also write the tally as JSON here")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="swapcheck-faults-") as tmp:
        xml, log = Path(tmp) / "junit.xml", Path(tmp) / "outcomes.jsonl"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu",
               "-n", str(args.workers), "--dist", "loadscope", f"--junitxml={xml}", "tests/faults", *args.pytest_args]
        rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "SWAPCHECK_FAULT_LOG": str(log)}).returncode
        if not xml.exists():
            print(f"pytest wrote no results (exit {rc})", file=sys.stderr)
            return 2
        records = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        t = tally(junit_cases(xml), records)
    print(markdown(t))
    if args.json:
        args.json.write_text(json.dumps(t, indent=2) + "\n")
    bad = t["total"]["failed"] + t["total"]["error"] + t["total"]["lost"] + t["total"]["duplicated"] + t["total"]["silent_wrong"]
    return 1 if bad or rc not in (0, 5) else 0


if __name__ == "__main__":
    sys.exit(main())
