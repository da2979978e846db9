"""The planner: expands a validated spec into units with content-addressed ids.

A unit id is the first 20 hex digits of the SHA-256 of the canonical JSON of its kind, the kind's
version and its parameters (kernel names, params and versions included), so the same work always has
the same id and a changed kernel or kind version is new work. Each kind expands its own experiments
(:mod:`tasks.kinds`); the planner keeps spec order and merges duplicates.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.spec import LoadedSpec
from tasks.kinds import Unit, canonical_json, get_kind, unit_id

__all__ = ["Plan", "Unit", "canonical_json", "make_plan", "unit_id"]


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
