"""Rich tables that fit the width they are printed at, never cutting a name.

A row's identifying cells (sweep, pair, arm, kernel, layer, linear, experiment:
:func:`reports.render.identifying`, the rule the HTML report keeps them whole by too)
are never cut, wrapped or ellipsised: their columns are ``no_wrap`` with ``min_width`` of their
longest cell, so a name reads whole on one line and two rows never read the same. Every other
column wraps at words and folds a word longer than its width (``overflow="fold"``: nothing is
dropped). When the columns do not fit even so, the ones that do not are moved to a second table
(a third, ...) that repeats the row's key (the fewest leading identifying columns that tell the
rows apart) and a line says so; ``--format markdown`` or ``--format json`` keeps every row whole.

Rich does the measuring (``Measurement``, ``Console.measure``) and the wrapping; this module only
decides which columns share a table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reports.render import first_word, identifying

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["MOVED_NOTE", "Fitted", "fitted_tables", "print_rows"]

#: The key a continued table repeats reaches at least the first column named by one of these words.
PAIR_WORDS = frozenset({"pair", "pairs", "arm", "arms", "kernel", "impl", "ref"})

#: Said once under a table whose other columns went to the tables that follow it.
MOVED_NOTE = "(more columns below, each row named again; --format markdown or json: every row on one line)"

#: A wrapping column is not squeezed below its longest word, up to this many characters (a longer
#: word folds).
FLOOR = 14
MIN_FLOOR = 6


def _measure(console: Console, texts: Sequence[str]) -> tuple[int, int]:
    """(longest word, longest line) of the texts, as rich measures them."""
    from rich.measure import Measurement
    from rich.text import Text

    options = console.options.update_width(1 << 20)
    sizes = [Measurement.get(console, options, Text(t)) for t in texts] or [Measurement(1, 1)]
    return max(m.minimum for m in sizes), max(m.maximum for m in sizes)


def _table(title: str | None, caption: str | None = None) -> Table:
    from rich.table import Table
    from rich.text import Text

    return Table(title=None if title is None else Text(title), caption=caption,
                 header_style="bold", caption_justify="left")


def _key(ids: list[str], cells: dict[str, list[str]]) -> list[str]:
    """The fewest leading identifying columns whose values tell the rows apart (all of them if none
    do), reaching at least the first pair, arm or kernel column: a continued row names its pair."""
    named = [i for i, c in enumerate(ids) if first_word(c) in PAIR_WORDS]
    for n in range(named[0] + 1 if named else 1, len(ids) + 1):
        seen = list(zip(*(cells[c] for c in ids[:n]), strict=True))
        if len(set(seen)) == len(seen):
            return ids[:n]
    return ids


_hinted = False


def print_rows(console: Console, rows: list[dict[str, Any]], title: str | None, cell: Callable[[str, Any], str],
               note: Callable[[str], None]) -> None:
    """Print rows as fitted tables on ``console`` (``--format table`` of every command); the first time
    in a process that a table printed to a pipe had to be narrowed, ``note`` the widen hint."""
    global _hinted
    from orchestrator.cli.consoles import WIDEN_HINT, piped_default

    if not rows:
        console.print(_table(title))
        console.print("(no rows)")
        return
    width = console.width
    fitted = fitted_tables(console, rows, width, title, cell=cell,
                           numeric=lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
    if fitted.natural > width and not _hinted and piped_default(console):
        _hinted = True
        note(WIDEN_HINT)
    for n, t in enumerate(fitted.tables):
        console.print(t, soft_wrap=False)  # the console soft-wraps text; a table keeps its fitted width
        if n == 0 and len(fitted.tables) > 1:
            console.print(MOVED_NOTE, highlight=False, markup=False, soft_wrap=False)


@dataclass
class Fitted:
    """The tables to print, and how wide the rows would be with every cell on one line."""

    tables: list[Table]
    natural: int


def fitted_tables(console: Console, rows: list[dict[str, Any]], width: int, title: str | None = None,
                  cell: Callable[[str, Any], str] | None = None, numeric: Callable[[Any], bool] | None = None,
                  ) -> Fitted:
    """The rows as rich tables no wider than ``width``: one table when the columns fit (wrapping
    as needed), else the first table and the ones its remaining columns moved to (see the module
    docstring; print :data:`MOVED_NOTE` after the first when there are several). ``cell(column,
    value)`` gives a cell's plain text (not rich markup); ``numeric(value)`` right-justifies its column."""
    from rich.text import Text
    fmt = cell or (lambda _c, v: "" if v is None else str(v))
    cols = list(rows[0]) if rows else []
    cells = {c: [fmt(c, r.get(c)) for r in rows] for c in cols}
    right = {c for c in cols if rows and numeric is not None and numeric(rows[0].get(c))}
    ids = [c for c in cols if identifying(c)]
    size = {c: _measure(console, [c, *cells[c]]) for c in cols}
    # The identifying columns stay whole unless they alone do not fit (then they fold, like the rest).
    whole = set(ids) if _fits(console, [(c, size[c][1]) for c in ids], width, title) else set()
    floor = {c: size[c][1] if c in whole else min(size[c][1], max(MIN_FLOOR, min(size[c][0], FLOOR))) for c in cols}

    # Each table: its leading identifying columns (all of them in the first, the key after), then as
    # many other columns as fit at their floors; a column that fits nowhere goes where it falls.
    first = ids if whole else []
    key = _key(ids, cells) if whole else []
    groups: list[list[str]] = []
    current, base = list(first), len(first)
    for c in (c for c in cols if c not in first):
        if not _fits(console, [(x, floor[x]) for x in [*current, c]], width, title) and (
                len(current) > base or (current and current != key)):
            groups.append(current)
            current, base = list(key), len(key)
        current.append(c)
    groups.append(current)

    tables: list[Table] = []
    for n, group in enumerate(groups):
        order = [c for c in cols if c in group]
        widths = _shared(console, order, {c: size[c][1] for c in order}, floor, width, title)
        t = _table(title if n == 0 else f"{title or 'table'} (continued, {n + 1} of {len(groups)})")
        for c in order:
            keep = c in whole
            t.add_column(c, justify="right" if c in right else "left", no_wrap=keep, overflow="fold",
                         min_width=size[c][1] if keep else None, width=None if keep else widths.get(c))
        for i in range(len(rows)):
            t.add_row(*(Text(cells[c][i]) for c in order))  # plain text: no rich markup in a cell
        tables.append(t)
    return Fitted(tables, _measured(console, [(c, size[c][1]) for c in cols], title))


def _shared(console: Console, order: list[str], natural: dict[str, int], floor: dict[str, int], width: int,
            title: str | None) -> dict[str, int]:
    """Widths of the wrapping columns of a table wider than ``width`` ({} when it fits as it is):
    each its floor, plus the width left over shared in proportion to what each lacks of its natural
    width. (Rich's own collapse shrinks the widest columns evenly, below their longest word, and its
    ratio columns overshoot when the minimums bind; so the share is computed here.)"""
    if _fits(console, [(c, natural[c]) for c in order], width, title):
        return {}
    at_floor = [(c, floor[c]) for c in order]
    spare = width - _measured(console, at_floor, title)
    need = {c: natural[c] - floor[c] for c in order if natural[c] > floor[c]}
    total = sum(need.values())
    if spare <= 0 or total <= 0:
        return dict(at_floor)
    give = {c: spare * k // total for c, k in need.items()} if spare < total else dict(need)
    for c in sorted(need, key=lambda c: need[c] - give[c], reverse=True)[:max(0, min(spare, total) - sum(give.values()))]:
        give[c] += 1
    return {c: floor[c] + give.get(c, 0) for c in order}


def _measured(console: Console, widths: list[tuple[str, int]], title: str | None) -> int:
    """How wide a table with columns of these widths is (rich adds padding and borders)."""
    t = _table(title)
    for name, w in widths:
        t.add_column(name, width=max(w, 1))
    return console.measure(t, options=console.options.update_width(1 << 20)).maximum


def _fits(console: Console, widths: list[tuple[str, int]], width: int, title: str | None) -> bool:
    """Whether columns of these widths fit in ``width``."""
    return _measured(console, widths, title) <= width
