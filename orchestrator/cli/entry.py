"""The ``swapcheck`` program (``[project.scripts]``): read the command line, then build what it needs."""

from __future__ import annotations

import sys

from orchestrator.cli import selection


def run() -> None:
    """Build the command ``sys.argv`` names (:mod:`orchestrator.cli.selection`) and run it."""
    selection.WANTED = selection.wanted(sys.argv[1:])
    from orchestrator.cli.main import app

    app()
