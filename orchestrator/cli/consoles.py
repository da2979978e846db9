"""The CLI's rich consoles, made on first use (orchestrator/cli/common.py holds ``out`` and ``err``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

#: Width of standard output when it is not a terminal (a pipe, a file, CI) and ``COLUMNS`` is unset:
#: what a CI log viewer shows without scrolling sideways. Tables fit it (orchestrator/cli/tables.py)
#: and say once how to widen them (:data:`WIDEN_HINT`).
PIPE_WIDTH = 120

#: Said once per process, on stderr, when a table printed to a pipe was fitted to :data:`PIPE_WIDTH`.
WIDEN_HINT = (f"note: piped tables fit {PIPE_WIDTH} columns; COLUMNS=250 widens them; "
              "--format markdown or json keeps each row on one line")


def stdout_console() -> Console:
    """Standard output's console: on a terminal, the terminal's width; otherwise (a pipe, a file, CI)
    :data:`PIPE_WIDTH` rather than the width of some terminal among stdin/stderr, or 80. ``COLUMNS``
    wins, read when printing (not frozen when the console is made). Colour follows rich: off when
    not a terminal, and off under ``NO_COLOR``."""
    from rich.console import Console, ConsoleDimensions

    class _Console(Console):
        @property
        def size(self) -> ConsoleDimensions:
            size = Console.size.fget(self)  # type: ignore[attr-defined]
            if self._width is None and piped_default(self):
                return ConsoleDimensions(PIPE_WIDTH, size.height)
            return size  # type: ignore[no-any-return]

        @size.setter
        def size(self, new_size: tuple[int, int]) -> None:
            Console.size.fset(self, new_size)  # type: ignore[attr-defined]

    console = _Console(soft_wrap=True)
    console._width = None  # rich froze COLUMNS at construction; Console.size reads it on every call
    return console


def piped_default(console: Console) -> bool:
    """Whether ``console`` writes to a pipe or file at :data:`PIPE_WIDTH` (no terminal, no ``COLUMNS``)."""
    return not console.is_terminal and not console._environ.get("COLUMNS", "").isdigit()


def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


class LazyConsole:
    """A rich ``Console`` made on first use: importing rich costs about 35 ms, most of a command that
    prints only JSON or CSV. Every attribute is the console's (``.console`` is the console itself,
    for APIs that want one, e.g. ``rich.progress.Progress(console=...)``)."""

    def __init__(self, make: Callable[[], Console]) -> None:
        self._make = make
        self._made: Console | None = None

    @property
    def console(self) -> Console:
        if self._made is None:
            self._made = self._make()
        return self._made

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


def real_console(console: Console) -> Console:
    """The rich console behind ``out`` / ``err`` (a :class:`LazyConsole`), for APIs that keep one."""
    return console.console if isinstance(console, LazyConsole) else console


def escape(text: str) -> str:
    """rich's markup escape, imported when first used."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)
