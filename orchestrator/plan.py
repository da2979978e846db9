"""The planner: expands a validated spec into units with content-addressed ids.

A unit id is the first 20 hex digits of the SHA-256 of the canonical JSON of its kind, the kind's
version and its parameters (kernel names, params and versions included), so the same work always has
the same id and a changed kernel or kind version is new work. Each kind expands its own experiments
(:mod:`tasks.kinds`); the planner keeps spec order and merges duplicates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.spec import LoadedSpec
from tasks.kinds import Unit, canonical_json, get_kind, unit_id

__all__ = ["CodeChange", "Plan", "Unit", "canonical_json", "code_changes", "make_plan", "unit_id"]


@dataclass(frozen=True)
class Plan:
    sweep: str
    spec_sha256: str
    units: list[Unit]

    def by_id(self) -> dict[str, Unit]:
        return {u.id: u for u in self.units}


def make_plan(spec: LoadedSpec) -> Plan:
    """Expand every experiment; units come out in spec order, duplicates merged."""
    units: dict[str, Unit] = {}
    for name, exp in spec.experiments.items():
        for u in get_kind(exp.kind).expand(name, exp):
            units.setdefault(u.id, u)
    return Plan(sweep=spec.sweep.name, spec_sha256=spec.sha256, units=list(units.values()))


def _without_code(value: Any) -> Any:
    """``value`` with every ``code`` fingerprint (a user's kernel's, tasks/fingerprint.py) left out."""
    if isinstance(value, dict):
        return {k: _without_code(v) for k, v in value.items() if k != "code"}
    if isinstance(value, list):
        return [_without_code(v) for v in value]
    return value


def _codes(value: Any, out: dict[str, str]) -> dict[str, str]:
    """kernel name -> code fingerprint, for every dict inside ``value`` that names both."""
    if isinstance(value, dict):
        if isinstance(value.get("code"), str) and isinstance(value.get("kernel"), str):
            out[value["kernel"]] = value["code"]
        for v in value.values():
            _codes(v, out)
    elif isinstance(value, list):
        for v in value:
            _codes(v, out)
    return out


@dataclass(frozen=True)
class CodeChange:
    """A user's kernel whose code changed since units of a sweep were computed with it."""

    kernel: str
    before: tuple[str, ...]  # the fingerprints the sweep's units were computed with
    now: tuple[str, ...]
    units: int  # planned units that equal a recorded one but for this kernel's code

    def line(self) -> str:
        what = self.kernel if self.kernel.startswith("kind ") else f"kernel {self.kernel}"
        return (f"the code of {what} changed since this sweep ran it (fingerprint "
                f"{', '.join(self.before)} -> {', '.join(self.now)}): {self.units} unit(s) are new work")


def kind_code_changes(planned: list[Unit], recorded: Mapping[str, Mapping[str, Any]]) -> list[CodeChange]:
    """When every planned unit equals a recorded one in kind and parameters (its id changed all the
    same) and each such kind is a user's or a plugin's (``tasks.kinds.kind_code``): the kinds whose
    code changed, one :class:`CodeChange` each (the earlier fingerprint is not recorded: "earlier").
    Else []."""
    from tasks.kinds import kind_code

    before = set()
    for row in recorded.values():
        try:
            before.add(_code_free_key(row.get("kind"), json.loads(row.get("params_json") or "{}")))
        except ValueError:
            continue
    counts: dict[str, int] = {}
    for u in planned:
        if _code_free_key(u.kind, u.params) not in before or kind_code(u.kind) is None:
            return []
        counts[u.kind] = counts.get(u.kind, 0) + 1
    return [CodeChange(f"kind {k}", ("earlier",), (str(kind_code(k)),), n) for k, n in sorted(counts.items())]


def _code_free_key(kind: str | None, params: Any) -> str:
    """What identifies a unit but for the code fingerprints of users' kernels."""
    return canonical_json([kind, _without_code(params)])


def code_changes(planned: list[Unit], recorded: Mapping[str, Mapping[str, Any]], *,
                 only: bool = False) -> list[CodeChange]:
    """Each user's kernel whose code changed (issue #36: an edited kernel had been served its old
    results): a planned unit that equals a recorded one but for the ``code`` fingerprints.
    ``recorded``: unit id -> ledger row (``kind``, ``params_json``). ``only``: none unless every
    planned unit is such a unit (nothing else about the plan changed)."""
    before: dict[str, dict[str, str]] = {}
    for row in recorded.values():
        try:
            params = json.loads(row.get("params_json") or "{}")
        except ValueError:
            continue
        before[_code_free_key(row.get("kind"), params)] = _codes(params, {})
    changed: dict[str, tuple[set[str], set[str], int]] = {}
    for u in planned:
        old = before.get(_code_free_key(u.kind, u.params))
        if old is None:
            if only:
                return []
            continue
        for kernel, code in _codes(u.params, {}).items():
            if kernel in old and old[kernel] != code:
                olds, news, n = changed.get(kernel, (set(), set(), 0))
                changed[kernel] = (olds | {old[kernel]}, news | {code}, n + 1)
    return [CodeChange(k, tuple(sorted(o)), tuple(sorted(n)), count) for k, (o, n, count) in sorted(changed.items())]
