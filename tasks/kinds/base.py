"""The contract every experiment kind fulfils, and the unit it plans.

A kind is one module under ``tasks/kinds/`` that builds a :class:`Kind`:

==============  ===================================================================================
field           what it is
==============  ===================================================================================
``name``        the ``kind = "..."`` of a spec experiment and of a ledger row
``version``     the version of its computation: part of every unit id, so bumping it makes new work
``spec``        its pydantic spec model (``None`` for a kind that another kind plans, such as
                ``teacher_forced``, which ``generate`` expands)
``tables``      the result tables its ``run`` writes (each declared in ``storage/schemas.py``)
``problems``    ``problems(where, exp) -> [str]``: cross-field rules that need a registry (kernels,
                algorithms, files); each message starts with its field path
``expand``      ``expand(experiment, exp) -> Iterable[Unit]``: the units of one experiment, in a
                deterministic order, resources (GPU requests) included; a generator keeps a
                large grid out of the driver's memory (a launch walks it twice: ids first,
                then the units as Ray's window takes them; orchestrator.plan.Plan)
``describe``    ``describe(params) -> str``: one human line per unit (progress, ``sweep plan``)
``run``         ``run(params, ctx) -> {table: rows}``: compute one unit; ``ctx`` is a
                :class:`UnitContext`, never a results path. Rows of a table are a list of
                dicts or a ``pyarrow.Table`` (columns: the fast path for many rows); either
                way without ``unit_id``/``experiment``, which the worker adds
``resolve``     ``resolve(exp, resolve_path) -> exp``: make the spec's relative paths absolute
``doc``         what the kind measures (its module docstring): ``swapcheck`` and the docs show it
``example``     one experiment table of a spec, as plain data (what TOML holds, ``kind`` included):
                the contract test (``tests/test_kinds.py``) validates and plans it, besides every
                experiment of this kind under ``sweeps/``; ``None`` for a kind without a spec model
==============  ===================================================================================

Kinds never import ``orchestrator`` or ``storage``: what a unit needs from the results tree (its
artifacts, an earlier stage's rows) comes through the :class:`UnitContext` the worker hands it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Union

from tasks.inputs import note
from tasks.kinds.fields import Resources, Strict

if TYPE_CHECKING:
    import pyarrow as pa

Rows = list[dict[str, Any]]
#: What ``run`` returns for one table: rows as dicts, or an Arrow table (columns).
TableRows = Union[Rows, "pa.Table"]  # noqa: UP007 - a string forward reference needs Union


class UnitContext(Protocol):
    """What a running unit may ask of the results tree (the worker implements it over storage)."""

    @property
    def sweep(self) -> str: ...

    @property
    def unit_id(self) -> str: ...

    def put_artifact(self, name: str, data: bytes) -> str:
        """Store ``data`` as this unit's artifact ``name``; return where it is (a relative path)."""
        ...

    def read_unit(self, table: str, unit_id: str, columns: list[str] | None = None) -> Rows:
        """The rows another (earlier-stage) unit of this sweep wrote to ``table``; [] if none."""
        ...


#: One encoder for every id (``json.dumps`` with these arguments builds a new one per call).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def canonical_json(obj: Any) -> str:
    """Sorted keys, no spaces, ASCII: the text a unit id hashes (tests/test_pinned_ids.py)."""
    return _CANONICAL.encode(obj)


def content_id(kind: str, version: str, params: Mapping[str, Any]) -> str:
    """A unit id: the first 20 hex digits of SHA-256 over the kind, its version and its parameters."""
    payload = canonical_json({"kind": kind, "task_version": version, "params": params})
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Unit:
    """One unit of work: a kind, its canonical parameters and what it needs to run."""

    id: str
    kind: str
    experiment: str
    params: dict[str, Any]
    resources: Resources = field(default_factory=Resources)
    #: Units run stage by stage: a later stage reads what an earlier one wrote.
    stage: int = 0
    #: Run in a fresh worker process that exits afterwards (a cold restart).
    fresh_process: bool = False
    #: Python packages the unit needs on its node (named when a launch cannot place it).
    needs: tuple[str, ...] = ()
    #: One human line (its kind's ``describe``); not part of the id.
    description: str = ""

    def describe(self) -> str:
        return self.description

    def to_payload(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "experiment": self.experiment, "params": self.params}


def _no_problems(where: str, exp: Any) -> list[str]:
    return []


def _keep_paths(exp: Any, resolve_path: Callable[[str], Path]) -> Any:
    return exp


def _planned_elsewhere(experiment: str, exp: Any) -> list[Unit]:
    raise TypeError("this kind has no spec model of its own: another kind plans its units")


@dataclass(frozen=True)
class Kind:
    """One experiment kind (see the module docstring for each field)."""

    name: str
    version: str
    spec: type[Strict] | None
    tables: tuple[str, ...]
    describe: Callable[[dict[str, Any]], str]
    run: Callable[[dict[str, Any], UnitContext | None], Mapping[str, TableRows]]
    expand: Callable[[str, Any], Iterable[Unit]] = _planned_elsewhere
    problems: Callable[[str, Any], list[str]] = _no_problems
    resolve: Callable[[Any, Callable[[str], Path]], Any] = _keep_paths
    doc: str = ""
    example: Mapping[str, Any] | None = None

    def unit(self, experiment: str, params: dict[str, Any], resources: Resources | None = None,
             **options: Any) -> Unit:
        """A unit of this kind with its content-addressed id (:meth:`id_version`: the version, and for a
        user's or a plugin's kind the fingerprint of its code)."""
        return Unit(content_id(self.name, self.id_version(), params), self.name, experiment, params,
                    resources or _NO_RESOURCES, description=self.describe(params), **options)

    def code(self) -> str | None:
        """The fingerprint of the code behind ``run`` when it comes from a user's package or a plugin
        (``tasks.fingerprint``); None for swapcheck's own kinds. Computed once per process."""
        key = (self.name, id(self))
        if key not in _KIND_CODES:
            from tasks.fingerprint import code_fingerprint

            _KIND_CODES[key] = code_fingerprint(self.run)
        code = _KIND_CODES[key]
        if code is not None:  # a plugin's kind: its code is an input of the expansion (tasks.inputs)
            note("tasks.kinds:kind_code", (self.name,), code)
        return code

    def id_version(self) -> str:
        """``version``, plus ``+code.<fingerprint>`` for a user's or a plugin's kind (:meth:`code`; the
        ids of swapcheck's own kinds stay pinned): an edit of such a kind's code makes its units new
        work (issue #36)."""
        code = self.code()
        return self.version if code is None else f"{self.version}+code.{code}"


#: The resources of a unit whose kind gives none (frozen: one instance serves every unit).
_NO_RESOURCES = Resources()

#: (kind name, id of the Kind) -> its code fingerprint (None for swapcheck's own kinds).
_KIND_CODES: dict[tuple[str, int], str | None] = {}
