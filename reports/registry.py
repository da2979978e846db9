"""Reports as registered views: the read-side twin of an experiment kind.

A :class:`Report` declares its question, its named query (``storage/queries/<query>.sql``, or a
``.sql`` file beside a plugin's module), its options, its columns with their units, and ``build``:
what it shows for ONE sweep (a :class:`View`). Everything around it is generic and lives in one
place: ``swapcheck report NAME`` (options, formats, ``--output``, help) is generated from the
registry, one view per sweep and never pooled (``orchestrator/cli/report.py``); ``report all``
iterates the registry for its sections (``reports.render``) and the nightly job for the summary
metrics it compares with its baseline (``metrics``: name -> value and rule, ``reports.metrics``).

Reports are found without a list to edit: every module of ``reports.views`` that defines
``REPORT``, and every ``swapcheck.reports`` entry point of an installed package (``name =
"module:REPORT"``). Adding a report is one module and one SQL file (docs/architecture.md).
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from swapcheck_common.registry import Registry, RegistryError

if TYPE_CHECKING:
    from reports.figures import Figure
    from storage.catalog import Catalog

__all__ = ["Block", "Option", "Report", "ReportError", "Section", "View", "builtin_report", "lazy", "merge_json",
           "report_registry", "reports", "sql_rows"]


class ReportError(RegistryError):
    """An unknown or duplicate report, or a report option out of range (exit code 2)."""


@dataclass(frozen=True)
class Option:
    """One ``--flag`` of a report beyond ``--results/--sweep/--format/--output``.

    ``default``'s type is the option's type (bool: a switch; int; str); ``choices`` makes it a choice.
    """

    name: str
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    flag: str | None = None  # default: --name with dashes

    @property
    def flags(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


@dataclass
class Block:
    """One piece of a report's human output: an optional heading, text lines, then a table."""

    title: str | None = None
    rows: list[dict[str, Any]] | None = None
    heading: str | None = None
    lines: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    key: str | None = None  # which --table shows it (None: every table)


@dataclass
class View:
    """What one report shows for one sweep.

    ``rows``: the machine rows (JSON and CSV), or one list per ``--table`` key; ``json``: the JSON
    object when it is not just ``rows``; ``blocks``: the human output (table and Markdown);
    ``empty``: said instead of the blocks when there is nothing to show; ``failure``: a line for
    stderr that makes the command exit 1 after printing (e.g. an edited pre-registration).
    """

    sweep: str
    rows: list[dict[str, Any]] | dict[str, list[dict[str, Any]]]
    blocks: list[Block] = field(default_factory=list)
    json: Any = None
    empty: str | None = None
    failure: str | None = None


@dataclass
class Section:
    """One section of ``report all`` (per sweep): figures and tables under a question."""

    id: str
    title: str
    intro: str
    tables: list[dict[str, Any]] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)


@dataclass(frozen=True)
class Report:
    """A registered view over the results (see the module docstring)."""

    name: str
    question: str
    help: str
    query: str
    build: Callable[[Catalog, str, dict[str, Any]], View]
    example: str = ""
    options: tuple[Option, ...] = ()
    tables: tuple[str, ...] = ()
    columns: dict[str, str] = field(default_factory=dict)
    document: Callable[[Catalog, str], list[Section]] | None = None
    metrics: Callable[[Catalog, str], dict[str, dict[str, Any]]] | None = None
    #: Optional: the one-line answer this report gives one sweep's question (None: nothing to say),
    #: shown in the summary that opens ``report all`` beside the kernel pairs' verdicts.
    answer: Callable[[Catalog, str], str | None] | None = None
    order: int = 100
    sql_dir: Path | None = None

    def defaults(self) -> dict[str, Any]:
        opts = {o.name: o.default for o in self.options}
        if self.tables:
            opts["table"] = "all"
        return opts

    def view(self, cat: Catalog, sweep: str, **opts: Any) -> View:
        """The view of one sweep, options not given taking their defaults."""
        return self.build(cat, sweep, {**self.defaults(), **opts})

    def sections(self, cat: Catalog, sweep: str) -> list[Section]:
        """What ``report all`` shows of this report for one sweep: ``document``, or else one section
        with the view's tables under the report's question."""
        if self.document is not None:
            return self.document(cat, sweep)
        v = self.view(cat, sweep)
        tabs = [{"title": b.title or self.question, "rows": b.rows, "note": "\n".join(b.after)}
                for b in v.blocks if b.rows is not None]
        return [Section(self.name, self.question, self.help.split("\n\n")[0], tabs)] if tabs else []


def sql_rows(cat: Catalog, report: Report, sweep: str, **params: Any) -> list[dict[str, Any]]:
    """The rows of ``report.query`` for one sweep: from ``storage/queries`` or, for a plugin, the
    ``.sql`` file beside its module (the same ``$param`` binding as every named query)."""
    if report.sql_dir is None:
        return cat.named(report.query, sweep=sweep, **params)
    from storage.catalog import sql_params

    sql = (report.sql_dir / f"{report.query}.sql").read_text(encoding="utf-8")
    bound = {p: {"sweep": sweep, **params}.get(p) for p in sql_params(sql)}
    return cat.query(sql, **bound).to_pylist()  # type: ignore[no-any-return]


def lazy(ref: str) -> Callable[..., Any]:
    """The function ``"module:attr"``, imported when first called: a view module stays light at import
    (``swapcheck --help`` imports no DuckDB or numpy) yet names the function that does the work."""

    def call(*args: Any, **kwargs: Any) -> Any:
        import importlib

        module, _, attr = ref.partition(":")
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)

    call.__qualname__ = call.__name__ = ref
    return call


def _valid(name: str, entry: object) -> None:
    if not isinstance(entry, Report) or entry.name != name:
        raise ReportError(f"{name!r} names {entry!r}, not the Report {name!r}")


_REPORTS: Registry[Report] | None = None


def report_registry() -> Registry[Report]:
    """The registry of reports: ``reports.views`` modules, then ``swapcheck.reports`` entry points."""
    global _REPORTS
    if _REPORTS is None:
        reg: Registry[Report] = Registry("report", error=ReportError, validate=_valid)
        import reports.views as views

        for mod in pkgutil.iter_modules(views.__path__):
            if not mod.name.startswith("_"):
                reg.register(mod.name.replace("_", "-"), f"reports.views.{mod.name}:REPORT")
        from importlib.metadata import entry_points

        for ep in entry_points(group="swapcheck.reports"):
            reg.register(ep.name, ep.value)
        _REPORTS = reg
    return _REPORTS


def builtin_report(name: str) -> Report | None:
    """The built-in report ``name`` (its ``reports.views`` module) loaded alone, with no other view
    imported and no plugin discovered (a CLI process that runs one report); None if no such module."""
    import importlib
    import importlib.util

    module = name.replace("-", "_")
    if not name or module.startswith("_") or module.replace("_", "-") != name:
        return None
    if importlib.util.find_spec(f"reports.views.{module}") is None:
        return None
    entry = getattr(importlib.import_module(f"reports.views.{module}"), "REPORT", None)
    _valid(name, entry)  # a module without REPORT is refused as the registry refuses it
    return cast(Report, entry)


def reports() -> list[Report]:
    """Every report, in the order ``report --help``, ``report all`` and the nightly show them."""
    return sorted(report_registry().values(), key=lambda r: (r.order, r.name))


def merge_json(objects: Iterable[Any]) -> Any:
    """The JSON of several sweeps' views side by side: lists of rows (each row names its sweep) are
    concatenated, objects merged key by key; a value that differs between sweeps becomes the list of
    each sweep's value. Nothing is summed or pooled."""
    objs = list(objects)
    if len(objs) == 1:
        return objs[0]
    if all(isinstance(o, list) for o in objs):
        return [x for o in objs for x in o]
    if all(isinstance(o, dict) for o in objs):
        keys = list(dict.fromkeys(k for o in objs for k in o))
        return {k: merge_json([o[k] for o in objs if k in o]) for k in keys}
    return objs[0] if all(o == objs[0] for o in objs) else objs

