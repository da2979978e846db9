"""Shared CLI helpers: error translation, output formats, consoles, verbosity, progress, options."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli.consoles import (
    LazyConsole,
    escape,
    real_console,
    stderr_console,
    stdout_console,
)
from orchestrator.errors import exit_code_for, foreign_exit_code, user_message

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["escape", "real_console"]  # re-exported: the CLI's modules import them from here

out: Console = LazyConsole(stdout_console)  # type: ignore[assignment]
err: Console = LazyConsole(stderr_console)  # type: ignore[assignment]

DEFAULT_RESULTS = "results"

#: ``-q`` (0: errors and results only), default (1: progress and notes), ``-v`` (2: engine logs too).
QUIET, NORMAL, VERBOSE = 0, 1, 2
verbosity = NORMAL


def note(message: str) -> None:
    """A progress or status line on stderr (not a result): silent under ``-q``."""
    if verbosity > QUIET:
        err.print(message, highlight=False, markup=False)


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 unit``, ``2 units``, ``0 units`` (``many`` for irregular plurals)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


class TableFormat(str, Enum):
    """``--format`` of a command that prints rows: what :func:`emit_rows` writes."""

    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"


class DocFormat(str, Enum):
    """``--format`` of ``report all``: a document (html only here)."""

    markdown = "markdown"
    html = "html"
    json = "json"


# Options shared by every command that reads results: declared once, used as type annotations
# (``results: ResultsOpt = DEFAULT_RESULTS``) so that help texts and flags cannot drift apart.
def _results_root(value: str) -> str:
    """``--results``: a directory or a pyarrow filesystem URI; never empty (that would be the cwd)."""
    if value is None:
        return value
    if not value.strip() or "\x00" in value:
        raise typer.BadParameter("give a results directory or URI (an empty path would write into the current directory)")
    return value


ResultsOpt = Annotated[str, typer.Option("--results", help="Results directory or URI (the Parquet tree).",
                                         callback=_results_root)]
SweepOpt = Annotated[str | None, typer.Option(
    "--sweep", help="Only this sweep (default: every sweep, each on its own; an unknown one exits 2).")]
FormatOpt = Annotated[TableFormat, typer.Option("--format", help="table, json, csv or markdown.")]


@contextmanager
def user_errors() -> Iterator[None]:
    """The one place an error becomes a message and an exit code (orchestrator.errors' table): an
    error :func:`~orchestrator.errors.exit_code_for` knows prints ``error: <message>`` on stderr (see
    :func:`report_error`) and exits with its code; anything else (a bug, ``typer.Exit``) propagates."""
    try:
        yield
    except Exception as exc:
        from orchestrator.cluster import keep_session

        keep_session(exc)  # a failed command keeps the embedded Ray instance's logs, and says where
        code = exit_code_for(exc)
        if code is None:
            raise
        report_error(exc)
        raise typer.Exit(code) from None


def report_error(exc: BaseException) -> None:
    """``error: <message>`` (``user_message``: a library's fault in one line); -v adds its traceback."""
    err.print(f"[bold red]error:[/] {escape(user_message(exc))}", highlight=False, markup=True)
    if verbosity >= VERBOSE and foreign_exit_code(exc) is not None:
        import traceback

        err.print("".join(traceback.format_exception(exc)), highlight=False, markup=False)


def _json_default(v: Any) -> Any:
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def _fmt_cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6):
            return f"{v:.3e}"
        return f"{v:.6g}"
    return str(v)


def emit_rows(rows: list[dict[str, Any]], fmt: TableFormat | str, title: str | None = None,
              cell: Callable[[str, Any], str] | None = None) -> None:
    """Print rows as a rich table, JSON array, CSV or Markdown table (``fmt`` by value)."""
    cell = cell or (lambda _k, v: _fmt_cell(v))
    fmt = TableFormat(getattr(fmt, "value", fmt))
    if fmt is TableFormat.json:
        sys.stdout.write(json.dumps(rows, default=_json_default, indent=1) + "\n")
        return
    cols = list(rows[0].keys()) if rows else []
    if fmt is TableFormat.csv:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: _json_default(v) if hasattr(v, "isoformat") else v for k, v in r.items()})
        sys.stdout.write(buf.getvalue())
        return
    if fmt is TableFormat.markdown:
        from reports.render import md_table  # the one Markdown table writer (cells escaped)

        if title:
            sys.stdout.write(f"### {title}\n\n")
        sys.stdout.write(md_table(rows, cell))
        return
    from orchestrator.cli.tables import print_rows  # fitted to the width; names never cut

    print_rows(real_console(out), rows, title, cell, note)


#: ``--user-kernels/--no-user-kernels``: whether spec entries may name kernels by ``module:attr`` (or
#: entry points). Off, nothing outside swapcheck's own kernels is imported (docs/specs.md, trust model).
UserKernelsOpt = Annotated[bool, typer.Option(
    "--user-kernels/--no-user-kernels",
    help="Allow kernels named by module:attr or entry point (importing a module runs its top-level code).")]


@contextmanager
def allow_user_kernels(enabled: bool) -> Iterator[None]:
    """Apply ``--no-user-kernels`` while the command runs, to this process and to the Ray workers it
    starts (they inherit the environment); without the flag an operator's ``SWAPCHECK_USER_KERNELS=0``
    stays in force."""
    import os

    before = os.environ.get("SWAPCHECK_USER_KERNELS")
    if not enabled:
        os.environ["SWAPCHECK_USER_KERNELS"] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SWAPCHECK_USER_KERNELS", None)
        else:
            os.environ["SWAPCHECK_USER_KERNELS"] = before

