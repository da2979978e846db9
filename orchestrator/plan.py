"""The planner: expands a validated spec into units with content-addressed ids.

A unit id is the first 20 hex digits of the SHA-256 of the canonical JSON of its kind, the kind's
version and its parameters (kernel names, params and versions included), so the same work always has
the same id and a changed kernel or kind version is new work. Each kind expands its own experiments
(:mod:`tasks.kinds`); the planner keeps spec order and merges duplicates.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.spec import LoadedSpec
from tasks.kinds import Unit, canonical_json, get_kind, unit_id
from tasks.kinds.fields import Resources

__all__ = ["CodeChange", "Plan", "PlanChanged", "Profile", "Unit", "canonical_json", "code_changes", "make_plan", "unit_id"]


@dataclass(frozen=True)
class Profile:
    """What a launch must know of a unit before it runs it (its checks, its stages, its batch class),
    shared by every unit alike: a plan keeps one per distinct profile, not one per unit."""

    kind: str
    stage: int
    fresh_process: bool
    resources: Resources
    needs: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """As plain data (the plan cache keeps it: orchestrator.plan_cache)."""
        return {"kind": self.kind, "stage": self.stage, "fresh_process": self.fresh_process,
                "resources": self.resources.model_dump(mode="json"), "needs": list(self.needs)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Profile:
        """:meth:`to_json` read back; ``KeyError``, ``TypeError`` or ``ValueError`` when it is not one."""
        return cls(str(data["kind"]), int(data["stage"]), bool(data["fresh_process"]),
                   Resources.model_validate(data["resources"], strict=False), tuple(data["needs"]))


class PlanChanged(UsageError):
    """A spec's expansion gave other units the second time it was walked (an input it reads changed)."""


class Plan:
    """A spec's units, streamed: the plan keeps each unit's id and :class:`Profile` (a few bytes a
    unit), and walks the expansion again (:meth:`iter_units`) when the units themselves are needed, so
    a launch's driver holds only the units in Ray's window, not the whole grid (issue #39).

    ``Plan(sweep, spec_sha256, units)`` plans a list of units (tests, tools); :func:`make_plan` a spec,
    lazily. Duplicates are merged (the first of equal ids is kept), in expansion order."""

    def __init__(self, sweep: str, spec_sha256: str, units: Iterable[Unit] | None = None, *,
                 expand: Callable[[], Iterable[Unit]] | None = None) -> None:
        if expand is None:
            kept = list(units or [])
            expand = lambda: kept  # noqa: E731 - a list is walked again as it is
        self.sweep = sweep
        self.spec_sha256 = spec_sha256
        self._expand = expand
        self._ids: list[str] | None = []
        self._id_array: Any = None
        self.which = array("I")  # unit index -> index of its profile in ``profiles``
        profiles: dict[Profile, int] = {}
        self._skip: set[int] = set()  # positions in the expansion of duplicates (merged)
        seen: set[str] = set()
        for j, u in enumerate(expand()):
            if u.id in seen:
                self._skip.add(j)
                continue
            seen.add(u.id)
            self._ids.append(u.id)
            p = Profile(u.kind, u.stage, u.fresh_process, u.resources, u.needs)
            self.which.append(profiles.setdefault(p, len(profiles)))
        self.profiles: list[Profile] = list(profiles)
        #: Where the ids came from: "expanded" (a walk of the spec) or "cache" (orchestrator.plan_cache).
        self.source = "expanded"
        #: The ids sorted, as an Arrow array, when known (a plan from the cache), else None.
        self.sorted_ids: Any = None

    @classmethod
    def from_parts(cls, sweep: str, spec_sha256: str, ids: Any, sorted_ids: Any, which: array[int],
                   profiles: list[Profile], skip: set[int], expand: Callable[[], Iterable[Unit]], *,
                   source: str) -> Plan:
        """A plan whose ids (Arrow string arrays, in plan order and sorted) and profiles are known
        already (orchestrator.plan_cache); its units are walked from ``expand`` when needed, and
        checked against its ids as any plan's are."""
        plan = cls.__new__(cls)
        plan.sweep, plan.spec_sha256, plan._expand = sweep, spec_sha256, expand
        plan._ids, plan._id_array, plan.sorted_ids = None, ids, sorted_ids
        plan.which, plan.profiles, plan._skip, plan.source = which, profiles, skip, source
        return plan

    @property
    def ids(self) -> list[str]:
        """Each unit's id, in plan order."""
        if self._ids is None:
            self._ids = self._id_array.to_pylist()
        return self._ids

    @property
    def id_array(self) -> Any:
        """The ids as one Arrow string array: what a relaunch matches against the ledger and the spec
        record without a Python string per unit (a plan from the cache never makes the list)."""
        if self._id_array is None:
            import pyarrow as pa

            self._id_array = pa.array(self.ids, pa.string())
        return self._id_array

    def __len__(self) -> int:
        return len(self._ids) if self._ids is not None else len(self._id_array)

    def profile(self, i: int) -> Profile:
        return self.profiles[self.which[i]]

    def iter_units(self, keep: Callable[[int], bool] | None = None) -> Iterator[Unit]:
        """The units (those whose index ``keep`` accepts), in plan order, from a new walk of the
        expansion; :class:`PlanChanged` if it no longer gives the planned ids."""
        i = 0
        for j, u in enumerate(self._expand()):
            if j in self._skip:
                continue
            if i >= len(self.ids) or u.id != self.ids[i]:
                raise PlanChanged(f"the spec of sweep {self.sweep!r} expanded to other units while it was launched "
                                  f"(unit {i}: planned {self.ids[i] if i < len(self.ids) else 'none'}, now {u.id}): "
                                  "a file it reads changed? Relaunch it.")
            if keep is None or keep(i):
                yield u
            i += 1
        if i != len(self.ids):
            raise PlanChanged(f"the spec of sweep {self.sweep!r} expanded to {i} units while it was launched, "
                              f"{len(self.ids)} were planned: a file it reads changed? Relaunch it.")

    @cached_property
    def units(self) -> list[Unit]:
        """Every unit in memory at once (small plans, tools and tests; a launch streams them)."""
        return list(self.iter_units())

    def by_id(self) -> dict[str, Unit]:
        return {u.id: u for u in self.units}


def make_plan(spec: LoadedSpec) -> Plan:
    """Expand every experiment; units come out in spec order, duplicates merged. The expansion is
    walked once here (ids and profiles) and again whenever the units are needed. A plan of the same
    spec, code and inputs kept by an earlier expansion is reused instead (orchestrator.plan_cache)."""
    from orchestrator import plan_cache
    from tasks.inputs import recording

    def expand() -> Iterator[Unit]:
        for name, exp in spec.experiments.items():
            yield from get_kind(exp.kind).expand(name, exp)

    cached, key = plan_cache.load(spec)
    if cached is not None:
        try:
            profiles = [Profile.from_json(p) for p in cached.profiles]
        except (KeyError, TypeError, ValueError):  # a file that does not describe profiles: expand the spec
            profiles = None
        if profiles is not None:
            return Plan.from_parts(spec.sweep.name, spec.sha256, cached.ids, cached.sorted_ids, cached.which,
                                   profiles, cached.skip, expand, source="cache")
    with recording() as rec:
        plan = Plan(spec.sweep.name, spec.sha256, expand=expand)
    if key is not None:
        plan_cache.save(key, plan, rec)
    return plan


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
