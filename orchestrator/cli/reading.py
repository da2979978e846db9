"""Reading results from a command: the one catalog (warnings first, ``--sweep`` checked), ``-o/--output``
and one JSON object on standard output. Light: imported when the CLI starts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from storage.catalog import Catalog


#: ``-o/--output FILE``: where a command that writes a report writes it (default: standard output).
OutputOpt = Annotated[Path | None, typer.Option("--output", "-o", help="Write the output to this file instead of standard output.",
                                                dir_okay=False, show_default=False)]


@contextmanager
def output_to(path: Path | None) -> Iterator[None]:
    """Send standard output (rows, tables, JSON) to ``path`` while the command renders; a note says where."""
    from orchestrator.cli.common import note

    if path is None:
        yield
        return
    with open(path, "w", encoding="utf-8") as fh, redirect_stdout(fh):
        yield
    note(f"wrote {path}")


def _sweep_option() -> str | None:
    """The ``--sweep`` the running command was given (every report command names its option ``sweep``)."""
    import importlib

    try:  # typer vendors click (typer._click) since 0.2x; older typer runs on click itself
        context = importlib.import_module("typer._click.globals").get_current_context
    except ImportError:
        context = importlib.import_module("click").get_current_context
    ctx = context(silent=True)
    value = ctx.params.get("sweep") if ctx is not None else None
    return value if isinstance(value, str) else None


def check_sweep(cat: Catalog, sweep: str | None) -> None:
    """A usage error (exit 2) naming the sweeps that exist when ``--sweep`` names none of them."""
    from orchestrator.errors import UsageError

    if sweep is None or sweep in cat.sweeps():
        return
    known = cat.all_sweeps()
    if sweep not in known:
        listed = ", ".join(known) or "none yet (run `swapcheck sweep launch` first)"
        raise UsageError(f"--sweep {sweep}: no such sweep in {cat.results}; sweeps: {listed}")


@contextmanager
def catalog(results: str, sweep: str | None = None) -> Iterator[Catalog]:
    """The one catalog of a report command; a usage error when ``--results`` does not exist or
    ``--sweep`` (``sweep``, else the running command's ``--sweep`` option) names no sweep there.

    Every file the catalog does not read (damaged, missing, foreign, orphaned) is one yellow
    ``warning:`` line on stderr, before any output: nothing is left out silently.
    """
    from orchestrator.cli.common import err, escape
    from orchestrator.errors import UsageError
    from storage.catalog import open_catalog
    from storage.store import open_store

    if not open_store(results).exists():
        raise UsageError(f"--results {results}: no such directory (run `swapcheck sweep launch` first)")
    with open_catalog(results) as cat:
        for line in cat.warnings:
            err.print(f"[bold yellow]warning:[/] {escape(line)}", highlight=False, markup=True)
        wanted = sweep if sweep is not None else _sweep_option()
        check_sweep(cat, wanted)
        for line in pooled_arms(cat, wanted):
            err.print(f"[bold yellow]warning:[/] {escape(line)}", highlight=False, markup=True)
        yield cat


def pooled_arms(cat: Catalog, sweep: str | None) -> list[str]:
    """One line per arm name that two ``generate`` experiments of one sweep share (specs launched
    before validation refused it): every report keys a run by sweep and arm, so their rows are pooled."""
    import tomllib

    lines = []
    for rec in cat.named("spec_records", sweep=sweep):
        try:
            spec = tomllib.loads(rec["spec_toml"] or "")
        except tomllib.TOMLDecodeError:
            continue
        owners: dict[str, list[str]] = {}
        for name, exp in (spec.get("experiments") or {}).items():
            if isinstance(exp, dict) and exp.get("kind") == "generate" and isinstance(exp.get("arms"), dict):
                for arm in exp["arms"]:
                    owners.setdefault(arm, []).append(name)
        lines += [f"sweep {rec['sweep']}: arm {arm!r} is an arm of experiments {', '.join(names)}: the reports over "
                  "generations (agreement, flips, divergence, certificate, predictions) pool their runs as one "
                  "arm's; relaunch under arm names unique in the sweep"
                  for arm, names in owners.items() if len(names) > 1]
    return lines


def write_json(obj: object) -> None:
    """One JSON object on standard output, as ``emit_rows`` writes rows."""
    import json
    import sys

    from orchestrator.cli.common import _json_default

    sys.stdout.write(json.dumps(obj, default=_json_default, indent=1) + "\n")

