"""Is this environment exactly the lock? ``python tools/check_lock.py requirements/cpu.lock``

Compares every distribution installed in the running interpreter's environment with the pins of a lock
written by ``uv pip compile`` (``name==version`` lines, hashes on continuation lines). Exit 0 when every
pin is installed at its version and nothing else is installed but swapcheck itself and the installers a
new venv brings (pip); exit 1 with one line per difference otherwise. ``make install`` runs it last, so
an install that drifted from the lock fails there instead of in a test weeks later.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import sys
from pathlib import Path

from packaging.utils import canonicalize_name

#: What may be installed beside the lock's pins: the project itself and what ``python -m venv`` brings.
ALLOWED_EXTRA = frozenset({"swapcheck", "pip"})

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def read_lock(path: Path) -> dict[str, str]:
    """{canonical name: pinned version} of a lock file; every requirement line must be an exact pin."""
    pins: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "--")) or raw.startswith((" ", "\t")):
            continue
        m = PIN.match(line)
        if m is None:
            raise SystemExit(f"{path}:{n}: not an exact pin (name==version): {line!r}")
        pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


def installed() -> dict[str, str]:
    return {canonicalize_name(d.metadata["Name"]): d.version for d in md.distributions()}


def differences(pins: dict[str, str], have: dict[str, str]) -> list[str]:
    out = []
    for name, version in sorted(pins.items()):
        got = have.get(name)
        if got is None:
            out.append(f"missing: {name}=={version}")
        elif got != version:
            out.append(f"version: {name} is {got}, the lock pins {version}")
    for name in sorted(set(have) - set(pins) - ALLOWED_EXTRA):
        out.append(f"not in the lock: {name}=={have[name]}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lock", type=Path)
    args = ap.parse_args(argv)
    diff = differences(read_lock(args.lock), installed())
    if diff:
        print(f"{sys.prefix} differs from {args.lock}:", *(f"  {d}" for d in diff), sep="\n", file=sys.stderr)
        print("reinstall with `rm -rf .venv && make install`, or refresh the lock with `make lock`",
              file=sys.stderr)
        return 1
    print(f"{sys.prefix}: {len(read_lock(args.lock))} distributions, exactly {args.lock}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
