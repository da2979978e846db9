"""``make gpu-kit-wheels``: the wheels the GPU kit carries to a borrowed machine, and the 64 MiB check.

A borrowed GPU machine (docs/gpu.md) has torch, Triton, numpy, pyarrow, scipy, typer, rich and ml_dtypes but
not pydantic (the spec models) nor DuckDB (the summary's reports), and no network. This downloads, into
``.kit-wheels/`` (git-ignored), the CPython 3.12 manylinux x86_64 wheels of exactly the versions
``requirements/cpu.lock`` pins, checked against the lock's hashes (``pip download --require-hashes``),
then checks what travels to the machine: the tracked and untracked-not-ignored files of the working tree
plus ``.kit-wheels/`` must stay under 64 MiB. ``infra/gpu-kit/run.sh`` installs them there only when the
machine's Python lacks them. ``--check`` only measures (exit 1 over the budget).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "cpu.lock"
WHEELS = REPO / ".kit-wheels"
#: What the kit needs that the borrowed machine lacks (with what pydantic needs beyond typing-extensions).
PACKAGES = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "duckdb")
#: What travels to the machine, at most (the device tool's limit).
BUDGET_BYTES = 64 * 2**20
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def lock_entries(lock: Path, names: tuple[str, ...]) -> str:
    """The lock's entries (pin and hash lines) of ``names``: a requirements file for --require-hashes."""
    out: list[str] = []
    keep = False
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==", line)
        if m:
            keep = m.group(1).lower().replace("_", "-") in names
        elif not line.startswith(" "):
            keep = False
        if keep and not line.lstrip().startswith("#"):
            out.append(line)
    found = {re.match(r"^([A-Za-z0-9_.-]+)==", x).group(1).lower() for x in out if not x.startswith(" ")}  # type: ignore[union-attr]
    missing = sorted(set(names) - found)
    if missing:
        raise SystemExit(f"{lock}: no pin for {', '.join(missing)}")
    return "\n".join(out).rstrip(" \\") + "\n"


def travelling_bytes() -> tuple[int, int]:
    """(bytes of the working tree that travels, bytes of .kit-wheels)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.split(b"\0")
    tree = sum((REPO / f.decode()).stat().st_size for f in files if f and (REPO / f.decode()).is_file())
    wheels = sum(p.stat().st_size for p in WHEELS.glob("*.whl")) if WHEELS.is_dir() else 0
    return tree, wheels


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only measure what travels")
    args = p.parse_args(argv)
    if not args.check:
        WHEELS.mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
            req.write(lock_entries(LOCK, PACKAGES))
            req.flush()
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                   "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                   *[f"--platform={x}" for x in PLATFORMS], "--require-hashes", "-r", req.name, "-d", str(WHEELS)]
            subprocess.run(cmd, check=True)
    tree, wheels = travelling_bytes()
    total = tree + wheels
    print(f"travels to the GPU machine: working tree {tree / 2**20:.1f} MiB + .kit-wheels {wheels / 2**20:.1f} MiB "
          f"= {total / 2**20:.1f} MiB of {BUDGET_BYTES / 2**20:.0f} MiB")
    for w in sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []:
        print(f"  {w.name} ({w.stat().st_size / 2**20:.1f} MiB)")
    if total > BUDGET_BYTES:
        print("over the budget: the device tool refuses a tree over 64 MiB (ignore or remove what need not travel)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
