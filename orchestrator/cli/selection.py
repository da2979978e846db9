"""Which commands a command line needs built: the one it names, or every one.

A CLI process runs one command, yet building every group costs each run its imports and the report
registry's discovery of plugins (``importlib.metadata`` entry points): about a tenth of a second, most
of a sub-second report's time. :func:`wanted` reads the command line before anything is built;
:mod:`orchestrator.cli.main`, run as a program (the ``swapcheck`` script or ``python -m``), builds
only the named group and, under ``report``, only the named report. Anything else -- no command,
``--help`` or ``--version`` before it, an unknown name, shell completion, or importing the ``app``
(tests, ``make docs``) -- builds every command, so help, errors and docs are the full CLI's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

#: The top-level commands, in the order ``swapcheck --help`` lists them.
COMMANDS = ("sweep", "kernels", "report", "check", "numerics", "tolerance", "query", "db", "nightly", "model", "version")

#: The module under ``orchestrator.cli`` of a command whose module is named otherwise.
MODULES = {"model": "models"}

#: Options of the top-level callback that take no value (anything else before the command: build all).
_FLAGS = ("-q", "--quiet", "-v", "--verbose")


@dataclass(frozen=True)
class Wanted:
    """The top-level command to build and, under ``report``, the report (None: every report)."""

    command: str
    report: str | None = None


def wanted(argv: Sequence[str]) -> Wanted | None:
    """What ``argv`` (the arguments after the program) runs, or None: build every command."""
    if any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):  # click's shell completion
        return None
    args = list(argv)
    while args and args[0] in _FLAGS:
        args.pop(0)
    if not args or args[0] not in COMMANDS:
        return None
    command, rest = args[0], args[1:]
    if command != "report" or not rest or rest[0].startswith("-"):
        return Wanted(command)
    return Wanted(command, rest[0])


#: Set by the program's entry (``orchestrator.cli.entry.run``, or ``orchestrator.cli.main`` run as
#: ``__main__``) before the groups are imported; None (every command) for any other importer.
WANTED: Wanted | None = None

