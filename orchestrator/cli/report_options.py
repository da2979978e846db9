"""Choices and the catalog of ``swapcheck report`` commands (light: imported when the CLI starts)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storage.catalog import Catalog


class By(str, Enum):
    """``report replay --by``: tables per layer type, per layer, or both."""

    type = "type"
    layer = "layer"
    both = "both"


class Bins(str, Enum):
    """``report flips --bins``: fixed decades or quantile bins of the margin."""

    decades = "decades"
    quantile = "quantile"


class CiUnit(str, Enum):
    """``report flips --ci-unit``: what the bootstrap resamples."""

    sequence = "sequence"
    position = "position"


class AgreementTable(str, Enum):
    """``report agreement --table``: which table to show."""

    all = "all"
    self = "self"
    cross = "cross"
    divergence = "divergence"
    positions = "positions"


@contextmanager
def catalog(results: str) -> Iterator[Catalog]:
    """The one catalog of a report command; a usage error when ``--results`` does not exist.

    Every file the catalog does not read (damaged, missing, foreign, orphaned) is one yellow
    ``warning:`` line on stderr, before any output: nothing is left out silently.
    """
    from rich.markup import escape

    from orchestrator.cli.common import err
    from orchestrator.errors import UsageError
    from storage.catalog import open_catalog
    from storage.store import open_store

    if not open_store(results).exists():
        raise UsageError(f"--results {results}: no such directory (run `swapcheck sweep launch` first)")
    with open_catalog(results) as cat:
        for line in cat.warnings:
            err.print(f"[bold yellow]warning:[/] {escape(line)}", highlight=False, markup=True)
        yield cat


def write_json(obj: object) -> None:
    """One JSON object on standard output, as ``emit_rows`` writes rows."""
    import json
    import sys

    from orchestrator.cli.common import _json_default

    sys.stdout.write(json.dumps(obj, default=_json_default, indent=1) + "\n")
