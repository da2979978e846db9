"""The streamed plan (issue #39): a launch keeps ids and profiles, not units; the scheduler pulls a
bounded number of units ahead of Ray's window; a second walk that gives other units stops the launch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import launch_in_process, tiny_spec_text


def _units(n: int, kind: str = "k", **kw: Any) -> list[Any]:
    from tasks.kinds.base import Unit, content_id

    return [Unit(content_id(kind, "1", {"i": i}), kind, "e", {"i": i}, **kw) for i in range(n)]


def test_a_plan_keeps_ids_and_shared_profiles_and_merges_duplicates() -> None:
    from orchestrator.plan import Plan
    from tasks.kinds.fields import Resources

    units = _units(5) + _units(3) + _units(2, kind="gpu", resources=Resources(num_gpus=1))
    plan = Plan("s", "x", units)
    assert len(plan) == 7 and plan.ids == [u.id for u in units[:5]] + [u.id for u in units[8:]]
    assert len(plan.profiles) == 2  # one per distinct (kind, stage, resources, ...), not one per unit
    assert [u.id for u in plan.iter_units(lambda i: i % 2 == 0)] == plan.ids[::2]
    assert [u.id for u in plan.units] == plan.ids


def test_a_second_walk_that_gives_other_units_stops_with_exit_2() -> None:
    from orchestrator.errors import UsageError
    from orchestrator.plan import Plan, PlanChanged

    walks = {"n": 0}

    def expand() -> Iterator[Any]:
        walks["n"] += 1
        yield from _units(4 if walks["n"] == 1 else 5)

    plan = Plan("s", "x", expand=expand)
    with pytest.raises(PlanChanged, match="expanded to other units while it was launched .unit 4: planned none") as info:
        list(plan.iter_units())
    assert isinstance(info.value, UsageError) and info.value.exit_code == 2


def test_pending_counts_what_the_checks_need_without_the_units() -> None:
    from orchestrator.plan import Plan
    from orchestrator.runner import Pending
    from tasks.kinds.fields import Resources

    units = _units(6) + _units(4, kind="gpu", resources=Resources(num_gpus=1))
    plan = Plan("s", "x", units)
    pending = Pending(plan, done={units[0].id, units[7].id})
    assert len(pending) == 8
    assert pending.count(lambda p: p.resources.num_gpus > 0) == 3
    assert pending.counts(lambda p: p.kind) == {"k": 5, "gpu": 3}
    assert [u.id for u in pending.units()] == [u.id for u in units if u.id not in {units[0].id, units[7].id}]
    first_gpu = pending.first(lambda p: p.kind == "gpu")
    assert first_gpu is not None and first_gpu.id == units[6].id


def test_the_scheduler_pulls_a_bounded_number_of_units_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator import runner
    from orchestrator.runner import Batches

    monkeypatch.setattr(runner, "QUEUED", 50)
    pulled = {"n": 0}
    units = _units(1000)

    def stream() -> Iterator[Any]:
        for u in units:
            pulled["n"] += 1
            yield u

    b = Batches(stream(), 0.0, {"CPU": 2.0}, counts={None: 1000})
    assert len(b) == 1000 and pulled["n"] == 0  # nothing pulled before the first task
    taken = [u.id for _ in range(10) for u in b.take(1)]
    assert pulled["n"] <= 50 + 10 and len(b) == 990
    while b:
        taken += [u.id for u in b.take(1)]
    assert taken == [u.id for u in units] and pulled["n"] == 1000


def test_a_launch_streams_its_units(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch never materializes ``Plan.units``: it walks the expansion, ids first."""
    from orchestrator.plan import Plan

    def refuse(self: Plan) -> list[Any]:
        raise AssertionError("a launch held every unit of its plan at once")

    monkeypatch.setattr(Plan, "units", property(refuse))
    summary = launch_in_process(tmp_path / "r", tiny_spec_text("streamed"))
    assert summary.n_ok == summary.n_units > 4
    again = launch_in_process(tmp_path / "r", tiny_spec_text("streamed"))
    assert again.n_skipped == summary.n_units
