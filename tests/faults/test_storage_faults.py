"""A results tree that fails (unwritable, disk full) stops the unit as a StorageFault, never a failed row."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from orchestrator.plan import make_plan
from orchestrator.spec import parse_spec
from orchestrator.worker import execute_unit
from storage.errors import StorageError, StorageFault
from storage.store import ResultStore
from tests.conftest import tiny_spec_text


def _payload() -> tuple[dict[str, Any], str, str]:
    spec = parse_spec(tiny_spec_text(seeds=1))
    plan = make_plan(spec)
    unit = plan.units[0]
    return {**unit.to_payload(), "description": unit.describe()}, plan.sweep, spec.sha256


def test_results_root_under_a_file_is_a_storage_fault(tmp_path: Path) -> None:
    (tmp_path / "plain-file").write_text("not a directory")
    results = tmp_path / "plain-file" / "results"
    payload, sweep, sha = _payload()
    with pytest.raises(StorageFault) as info:
        execute_unit(payload, str(results), sweep, sha)
    assert isinstance(info.value, StorageError)
    assert str(tmp_path / "plain-file") in info.value.path
    assert "NotADirectoryError" in info.value.detail or "FileExistsError" in info.value.detail


def test_unwritable_result_partition_writes_no_failed_row(tmp_path: Path) -> None:
    payload, sweep, sha = _payload()
    (tmp_path / "table=kdepth").write_text("a file where the partition directory goes")
    with pytest.raises(StorageFault) as info:
        execute_unit(payload, str(tmp_path), sweep, sha)
    assert "table=kdepth" in info.value.path and payload["id"] in info.value.path
    assert ResultStore(tmp_path).ledger(sweep) == {}, "a storage fault is never a failed unit"
    assert ResultStore(tmp_path).attempts(sweep, payload["id"]) == 1
    assert not list(tmp_path.glob("table=units/*/*.parquet"))


def test_unwritable_ledger_is_a_storage_fault(tmp_path: Path) -> None:
    payload, sweep, sha = _payload()
    (tmp_path / "table=units").write_text("a file where the ledger goes")
    with pytest.raises(StorageFault) as info:
        execute_unit(payload, str(tmp_path), sweep, sha)
    assert "table=units" in info.value.path
    # The result file was written but no ledger row names it: the unit stays pending.
    assert (tmp_path / f"table=kdepth/sweep={sweep}/{payload['id']}.parquet").is_file()
    assert not ResultStore(tmp_path).done_units(sweep)


def test_disk_full_while_writing_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload, sweep, sha = _payload()
    real_put = ResultStore._put

    def full_for_results(self: ResultStore, path: str, data: bytes) -> None:
        if "/table=" in path:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        real_put(self, path, data)

    monkeypatch.setattr(ResultStore, "_put", full_for_results)
    with pytest.raises(StorageFault, match="No space left") as info:
        execute_unit(payload, str(tmp_path), sweep, sha)
    assert "table=kdepth" in info.value.path
    monkeypatch.undo()
    assert ResultStore(tmp_path).ledger(sweep) == {}


def test_a_raising_kind_is_still_the_units_failure(tmp_path: Path) -> None:
    payload, sweep, sha = _payload()
    payload = {**payload, "params": {**payload["params"], "k": -1}}
    summary = execute_unit(payload, str(tmp_path), sweep, sha)
    assert summary["status"] == "failed"
    row = ResultStore(tmp_path).ledger_records(sweep)[payload["id"]]
    assert row["status"] == "failed" and row["files"] == []


def test_storage_fault_pickles_whole() -> None:
    import pickle

    exc = pickle.loads(pickle.dumps(StorageFault("/r/table=units", "OSError: disk full")))
    assert (exc.path, exc.detail) == ("/r/table=units", "OSError: disk full")
    assert "/r/table=units" in str(exc)


@pytest.mark.slow
def test_storage_fault_reaches_the_ray_driver(tmp_path: Path, ray_local: Any) -> None:
    import ray

    (tmp_path / "plain-file").write_text("not a directory")
    payload, sweep, sha = _payload()
    ref = ray.remote(execute_unit).remote(payload, str(tmp_path / "plain-file" / "results"), sweep, sha)
    with pytest.raises(StorageFault) as info:
        ray.get(ref)
    assert str(tmp_path / "plain-file") in str(info.value)
    assert str(tmp_path / "plain-file") in getattr(info.value, "path", "")  # the driver can name the path
