"""The nightly check against upstream: ``make test-latest`` (not part of CI's gate).

Resolves the newest versions that ``pyproject.toml`` allows (``uv pip compile --upgrade``, the same
inputs as ``make lock``: the dev extra, the CPU torch pin), installs them into a venv of their own
(``.venv-latest``, the project's ``.venv`` is untouched), runs the default test suite there and
reports:

* which pins moved against ``requirements/cpu.lock`` (name, locked version, newest version);
* the suite's outcome, and each failing or erroring test by its id.

Everything lands in ``--out`` (default ``results/test-latest``): ``latest.lock``, ``junit.xml``,
``pytest.log`` and ``report.md`` / ``report.json``. Exit status: pytest's (0 when the newest versions
pass, 1 when a test fails), 2 when the resolution or the install fails. A failure here is found on our
schedule: pin the dependency below the release that broke (pyproject.toml) or fix the code, then
``make lock``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from check_lock import read_lock  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "cpu.lock"


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=REPO, text=True, **kw)  # type: ignore[call-overload,no-any-return]


def moved_pins(locked: dict[str, str], latest: dict[str, str]) -> list[dict[str, str | None]]:
    """Every distribution whose version differs between the lock and the newest resolution."""
    rows: list[dict[str, str | None]] = []
    for name in sorted(set(locked) | set(latest)):
        if locked.get(name) != latest.get(name):
            rows.append({"name": name, "locked": locked.get(name), "latest": latest.get(name)})
    return rows


def failures(junit: Path) -> tuple[dict[str, int], list[str]]:
    """(counts, failing test ids) from pytest's JUnit XML."""
    if not junit.exists():
        return {}, []
    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    failed = []
    for case in suite.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    return counts, failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch-wheels", default="/opt/wheels", help="directory holding the torch 2.13.0+cpu wheel")
    ap.add_argument("--venv", type=Path, default=REPO / ".venv-latest")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "test-latest")
    ap.add_argument("pytest_args", nargs="*", default=["-n", "2", "--dist", "loadscope", "-m", "not slow and not gpu"],
                    help="arguments for pytest (default: the default suite)")
    args = ap.parse_args(argv)
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        print("uv not found: run `make install` first", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    latest_lock = args.out / "latest.lock"
    # The CPU build of torch: the local wheel where there is one, else PyTorch's CPU index (as the Makefile).
    links = (["--find-links", args.torch_wheels] if Path(args.torch_wheels).is_dir() else
             ["--extra-index-url", "https://download.pytorch.org/whl/cpu", "--index-strategy", "unsafe-best-match"])
    resolved = run([uv, "pip", "compile", "pyproject.toml", "--extra", "dev", "-c", "requirements/cpu-constraints.txt",
                    *links, "--upgrade", "--python-version", "3.11", "--no-header", "--quiet", "-o", str(latest_lock)])
    if resolved.returncode != 0:
        print("test-latest: the newest allowed versions do not resolve (see above)", file=sys.stderr)
        return 2
    moved = moved_pins(read_lock(LOCK), read_lock(latest_lock))
    print(f"\n{len(moved)} pins differ from {LOCK.relative_to(REPO)}:")
    for m in moved:
        print(f"  {m['name']:<32} {m['locked'] or '-':>16} -> {m['latest'] or '-'}")

    py = args.venv / "bin" / "python"
    steps = [[uv, "venv", "--allow-existing", "--python", sys.executable, str(args.venv)],
             [uv, "pip", "sync", "--python", str(py), *links, str(latest_lock)],
             [uv, "pip", "install", "--python", str(py), "--no-deps", "--no-build-isolation", "-e", "."]]
    for step in steps:
        if run(step).returncode != 0:
            print("test-latest: installing the newest versions failed (see above)", file=sys.stderr)
            return 2

    junit, log = args.out / "junit.xml", args.out / "pytest.log"
    with log.open("w") as fh:
        proc = subprocess.Popen([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                                 *args.pytest_args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            fh.write(line)
        rc = proc.wait()
    counts, failed = failures(junit)
    report = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "pytest_exit": rc,
              "tests": counts, "failed": failed, "moved": moved, "pytest_args": args.pytest_args}
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    md = [f"# test-latest {report['when']}", "",
          f"pytest exit {rc}: {counts.get('tests', 0)} tests, {counts.get('failures', 0)} failed, "
          f"{counts.get('errors', 0)} errors, {counts.get('skipped', 0)} skipped", "",
          *(["| package | locked | newest allowed |", "|---|---|---|",
             *(f"| {m['name']} | {m['locked'] or '-'} | {m['latest'] or '-'} |" for m in moved)] if moved else
            [f"No pin moved: every pin of {LOCK.relative_to(REPO)} is the newest version pyproject.toml allows."]),
          ""]
    if failed:
        md += ["Failing with the newest versions:", "", *(f"- `{t}`" for t in failed), ""]
    (args.out / "report.md").write_text("\n".join(md))
    verdict = "the newest allowed versions pass" if rc == 0 else f"{len(failed)} tests fail with the newest versions"
    print(f"\ntest-latest: {verdict}; {len(moved)} pins moved; report: {(args.out / 'report.md').relative_to(REPO)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
