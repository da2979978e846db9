"""Group commit (issue #25): units finishing together in one worker share one durable commit.

In-process, no Ray: the worker's own batch path (``execute_units``) and the store's group commit
(``ResultStore.stage_unit`` / ``commit_units``) on real files, and the driver's batch sizing
(``orchestrator.runner.Batches``) on real plans. The end-to-end cases (Ray, SIGKILL of a worker
mid-batch, stops) are in tests/faults/test_group_commit_faults.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import storage.store as store_module
from orchestrator.plan import make_plan
from orchestrator.runner import MAX_BATCH, Batches
from orchestrator.spec import parse_spec
from orchestrator.worker import execute_unit, execute_units
from storage.errors import StorageFault
from storage.store import ResultStore, ledger_bytes, to_table
from tasks.kinds import kind_ref
from tests import _group_commit_kind as probe

SHA = "0" * 64
#: Ledger columns that differ between two runs of the same unit.
VOLATILE = {"started_at", "finished_at", "duration_s", "pid", "files"}



@pytest.fixture(autouse=True)
def _gc_probe_kind() -> Iterator[None]:
    with probe.registered():
        yield


def _payloads(n: int, name: str = "gc", **lists: Any) -> tuple[list[dict[str, Any]], str]:
    plan = make_plan(parse_spec(probe.spec_text(name, n, **lists)))
    return [{**u.to_payload(), "description": u.describe(), "kind_ref": kind_ref(u.kind)} for u in plan.units], plan.sweep


def _ledger_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("table=units/*/*.parquet") if p.is_file())


def _stable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in VOLATILE}


def test_a_batch_commits_what_units_committed_alone_commit(tmp_path: Path) -> None:
    payloads, sweep = _payloads(4)
    alone, together = ResultStore(tmp_path / "alone"), ResultStore(tmp_path / "together")
    singles = [execute_unit(p, str(alone.root), sweep, SHA) for p in payloads]
    batch = execute_units(payloads, str(together.root), sweep, SHA)
    assert [s["status"] for s in batch] == ["ok"] * 4 and [s["rows"] for s in batch] == [1] * 4
    assert [{k: s[k] for k in ("unit_id", "status", "rows", "attempts")} for s in batch] == \
           [{k: s[k] for k in ("unit_id", "status", "rows", "attempts")} for s in singles]
    assert all(s["duration_s"] > 0 for s in batch)
    a, b = alone.ledger_records(sweep), together.ledger_records(sweep)
    assert {u: _stable(r) for u, r in a.items()} == {u: _stable(r) for u, r in b.items()}
    for u in a:
        assert [(f["table"], f["path"], f["rows"]) for f in a[u]["files"]] == [(f["table"], f["path"], f["rows"]) for f in b[u]["files"]]
        assert alone.read_unit(probe.TABLE, sweep, u) == together.read_unit(probe.TABLE, sweep, u)
        # The ledger file holds exactly the bytes ledger_bytes makes of its row (sweep verify relies on it).
        assert bytes(ledger_bytes(b[u])) == (together.root / f"table=units/sweep={sweep}/{u}.parquet").read_bytes()
    from storage import verify

    assert verify.verify(together, sweep) == []
    # Every result file carries its unit's row: a lost ledger file is rebuilt from it, column for column.
    assert verify.rebuild_ledger_row(together, sweep, payloads[2]["id"])[0] == b[payloads[2]["id"]]
    assert not list(together.root.rglob("*.tmp-*"))


def test_a_failing_unit_in_a_batch_is_one_failed_row_the_others_are_ok(tmp_path: Path) -> None:
    payloads, sweep = _payloads(5, fail=[2])
    out = execute_units(payloads, str(tmp_path), sweep, SHA)
    assert [s["status"] for s in out] == ["ok", "ok", "failed", "ok", "ok"]
    assert "planted failure of unit 2" in out[2]["error"]
    store = ResultStore(tmp_path)
    rows = store.ledger_records(sweep)
    assert len(rows) == 5 and store.done_units(sweep) == {p["id"] for i, p in enumerate(payloads) if i != 2}
    failed = rows[payloads[2]["id"]]
    assert (failed["status"], failed["files"], failed["rows"], failed["tables"]) == ("failed", [], 0, [])
    assert all(rows[p["id"]]["attempts"] == 1 for p in payloads)
    data = pq.read_table(tmp_path / f"table={probe.TABLE}").to_pylist()
    assert sorted((r["unit_id"], r["i"]) for r in data) == sorted((p["id"], i) for i, p in enumerate(payloads) if i != 2)


def test_a_cancel_a_library_wrapped_is_a_cancel_not_a_failed_row(tmp_path: Path) -> None:
    payloads, sweep = _payloads(3, interrupt=[1])
    with pytest.raises(KeyboardInterrupt):
        execute_units(payloads, str(tmp_path), sweep, SHA)
    assert _ledger_files(tmp_path) == []  # the batch committed nothing; no unit is blamed for the stop


def test_result_files_are_renamed_before_any_ledger_file_after_one_barrier(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    payloads, sweep = _payloads(4)
    renamed: list[str] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        renamed.append(dst.split("/table=")[1].split("/")[0])
        real_replace(src, dst)

    syncs: list[int] = []
    real_syncfs = store_module._syncfs()
    if real_syncfs is not None:
        monkeypatch.setattr(store_module, "_syncfs", lambda: lambda fd: syncs.append(fd) or real_syncfs(fd))
    monkeypatch.setattr(os, "replace", spy)
    execute_units(payloads, str(tmp_path), sweep, SHA)
    assert renamed == [probe.TABLE] * 4 + ["units"] * 4
    if real_syncfs is not None:
        assert len(syncs) == 1  # one durability barrier for 8 files on one file system
    assert len(ResultStore(tmp_path).done_units(sweep)) == 4


def test_without_syncfs_each_file_is_fsynced_and_the_commit_is_the_same(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "SYNCFS_FROM_FILES", 10**9)
    payloads, sweep = _payloads(3)
    fsynced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsynced.append(fd) or real_fsync(fd))
    execute_units(payloads, str(tmp_path), sweep, SHA)
    assert len(fsynced) == 6 and len(ResultStore(tmp_path).done_units(sweep)) == 3


@pytest.mark.parametrize("why", ["file system", "dirty"])
def test_where_syncfs_is_not_trusted_or_would_wait_for_others_each_file_is_fsynced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    if store_module._syncfs() is None:
        pytest.skip("no syncfs here: every batch fsyncs each file (the test above)")
    if why == "file system":  # as on NFS or FUSE, where syncfs may only hand the data to a client or server
        monkeypatch.setattr(store_module, "SYNCFS_FILE_SYSTEMS", frozenset())
    else:  # the machine holds more dirty data than the limit: syncfs would wait for other writers' too
        monkeypatch.setattr(store_module, "SYNCFS_MAX_DIRTY_BYTES", -1)
    payloads, sweep = _payloads(4)
    fsynced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsynced.append(fd) or real_fsync(fd))
    monkeypatch.setattr(store_module, "_syncfs", lambda: lambda fd: pytest.fail("syncfs called"))
    execute_units(payloads, str(tmp_path), sweep, SHA)
    assert len(fsynced) == 8 and len(ResultStore(tmp_path).done_units(sweep)) == 4


def _staged(store: ResultStore, sweep: str, payloads: list[dict[str, Any]]) -> list[store_module.StagedUnit]:
    def row(p: dict[str, Any]) -> Any:
        from orchestrator.worker import ledger_row, utcnow

        return lambda files: ledger_row(p, SHA, status="ok", attempts=1, started=utcnow(), duration_s=0.0, error=None,
                                        tables=[f.table for f in files], rows=sum(f.rows for f in files),
                                        ran_here=False, files=files)

    return [store.stage_unit(sweep, p["id"], {probe.TABLE: [{"unit_id": p["id"], "experiment": "p", "i": i, "slept_s": 0.0}]},
                             row(p)) for i, p in enumerate(payloads)]


def test_a_result_file_that_cannot_be_written_publishes_no_ledger_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    payloads, sweep = _payloads(5)
    store = ResultStore(tmp_path)
    staged = _staged(store, sweep, payloads)
    third = f"table={probe.TABLE}/sweep={sweep}/{payloads[2]['id']}.parquet"
    real_stage = ResultStore._stage

    def disk_full_for_the_third(self: ResultStore, path: str, data: Any, sync: bool = True) -> str | None:
        if path.endswith(third):
            raise OSError(28, "No space left on device", path)
        return real_stage(self, path, data, sync)

    monkeypatch.setattr(ResultStore, "_stage", disk_full_for_the_third)
    with pytest.raises(StorageFault, match="No space left") as info:
        store.commit_units(staged)
    assert info.value.path.endswith(third)
    assert _ledger_files(tmp_path) == [] and not list(tmp_path.rglob("*.tmp-*"))
    assert not list(tmp_path.glob(f"table={probe.TABLE}/*/*.parquet"))  # nothing was published


def test_a_result_rename_that_fails_publishes_no_ledger_file_of_the_batch(tmp_path: Path) -> None:
    payloads, sweep = _payloads(5)
    store = ResultStore(tmp_path)
    staged = _staged(store, sweep, payloads)
    third = tmp_path / f"table={probe.TABLE}/sweep={sweep}/{payloads[2]['id']}.parquet"
    (third / "in-the-way").mkdir(parents=True)  # a directory where the 3rd unit's file goes: its rename fails
    with pytest.raises(StorageFault) as info:
        store.commit_units(staged)
    assert info.value.path == str(third)
    assert _ledger_files(tmp_path) == [] and not list(tmp_path.rglob("*.tmp-*"))
    assert store.done_units(sweep) == set()


def test_a_ledger_file_that_cannot_be_written_publishes_none(tmp_path: Path) -> None:
    payloads, sweep = _payloads(4)
    store = ResultStore(tmp_path)
    staged = _staged(store, sweep, payloads)
    (tmp_path / "table=units").write_text("a file where the ledger goes")
    with pytest.raises(StorageFault) as info:
        store.commit_units(staged)
    assert "table=units" in info.value.path and payloads[0]["id"] in info.value.path
    # The result files are in place, but no ledger row names them: every unit stays pending.
    assert len(list(tmp_path.glob(f"table={probe.TABLE}/*/*.parquet"))) == 4
    assert not list(tmp_path.rglob("*.tmp-*"))


def test_a_failing_ledger_rename_stops_the_renames_after_it(tmp_path: Path) -> None:
    payloads, sweep = _payloads(5)
    store = ResultStore(tmp_path)
    staged = _staged(store, sweep, payloads)
    third = tmp_path / f"table=units/sweep={sweep}/{payloads[2]['id']}.parquet"
    (third / "in-the-way").mkdir(parents=True)
    with pytest.raises(StorageFault) as info:
        store.commit_units(staged)
    assert info.value.path == str(third)
    assert store.done_units(sweep) == {payloads[0]["id"], payloads[1]["id"]}  # committed before the fault
    assert _ledger_files(tmp_path) == sorted(f"{p['id']}.parquet" for p in payloads[:2])
    assert not list(tmp_path.rglob("*.tmp-*"))


class _ObjectStore(pafs.FileSystemHandler):
    """An object store in memory (pyarrow's mock file system behind a handler): every put recorded
    in order; ``fail`` is a path whose put fails. Not a local file system, so the store puts each
    file whole, as on S3."""

    def __init__(self, fail: str = "") -> None:
        self.fs = pafs._MockFileSystem()
        self.puts: list[str] = []
        self.fail = fail

    def get_type_name(self) -> str:
        return "gc-object-store"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.fs.create_dir(path, recursive=recursive)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        if path.endswith(self.fail) and self.fail:
            raise OSError(5, "Input/output error (planted)", path)
        self.puts.append(path)
        return self.fs.open_output_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.fs.open_input_file(path)

    def open_input_stream(self, path: str) -> Any:
        return self.fs.open_input_stream(path)

    def delete_dir(self, path: str) -> None: ...
    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None: ...
    def delete_root_dir_contents(self) -> None: ...
    def delete_file(self, path: str) -> None: ...
    def move(self, src: str, dest: str) -> None: ...
    def copy_file(self, src: str, dest: str) -> None: ...
    def open_append_stream(self, path: str, metadata: Any) -> Any: ...


def _object_store(handler: _ObjectStore) -> ResultStore:
    store = ResultStore("bucket/prefix")
    store.fs, store.base, store.local, store.uri = pafs.PyFileSystem(handler), "bucket/prefix", False, "s3://bucket/prefix"
    return store


def test_on_an_object_store_the_ledger_puts_start_after_every_result_put() -> None:
    payloads, sweep = _payloads(4)
    handler = _ObjectStore()
    store = _object_store(handler)
    store.commit_units(_staged(store, sweep, payloads))
    tables = [p.split("/table=")[1].split("/")[0] for p in handler.puts]
    assert tables == [probe.TABLE] * 4 + ["units"] * 4
    assert store.done_units(sweep) == {p["id"] for p in payloads}

    failing = _ObjectStore(fail=f"table={probe.TABLE}/sweep={sweep}/{payloads[2]['id']}.parquet")
    store = _object_store(failing)
    with pytest.raises(StorageFault, match="planted") as info:
        store.commit_units(_staged(store, sweep, payloads))
    assert info.value.path.endswith(f"{payloads[2]['id']}.parquet")
    assert not [p for p in failing.puts if "/table=units/" in p]  # no ledger put after the fault


def test_to_table_builds_in_the_declared_schema_and_casts_only_what_differs() -> None:
    schema = probe.SCHEMA
    rows = [{"unit_id": "u", "experiment": "e", "i": 1, "slept_s": 0.5}]
    full = to_table(probe.TABLE, rows)
    assert full.schema.equals(schema) and full.to_pylist() == rows
    partial = to_table(probe.TABLE, [{"i": 2}], {"unit_id": "u", "experiment": "e"})
    assert partial.to_pylist() == [{"unit_id": "u", "experiment": "e", "i": 2, "slept_s": None}]
    narrow = to_table(probe.TABLE, pa.table({"i": pa.array([3], pa.int32()), "slept_s": [1.0]}), {"unit_id": "u", "experiment": "e"})
    assert narrow.schema.equals(schema) and narrow.column("i").type == pa.int64()
    same = to_table(probe.TABLE, full)
    assert same is full
    with pytest.raises(ValueError, match="undeclared"):
        to_table(probe.TABLE, [{"nope": 1}])


# -- the driver's batch sizes ------------------------------------------------------------------------

def _units(n: int, **lists: Any) -> list[Any]:
    return make_plan(parse_spec(probe.spec_text("gc", n, **lists))).units


def test_batches_start_with_single_units_and_keep_four_tasks_per_slot_in_flight() -> None:
    b = Batches(_units(1000), 0.075, {"CPU": 2.0})
    firsts = [b.take(2000) for _ in range(9)]
    assert [len(t) for t in firsts] == [1] * 8 + [0]  # 2 slots: 8 tasks in flight, one unit each so far
    b.settled(firsts[0], [0.0005])
    assert len(b.take(2000)) == 1  # one finished unit is not enough to go by
    b.settled(firsts[1], [0.0005])
    b.settled(firsts[2], [0.0005])
    assert [len(b.take(2000)) for _ in range(3)] == [MAX_BATCH, MAX_BATCH, 0]  # tiny units: the most per task
    assert len(b.take(10)) == 0 and b.n_tasks == 11


def test_the_tail_of_a_stage_is_spread_over_every_slot() -> None:
    b = Batches(_units(300), 0.075, {"CPU": 2.0})
    sizes = []
    while b:
        t = b.take(2000)
        sizes.append(len(t))
        b.settled(t, [0.0005] * len(t))
    assert sizes == [1, 1, 1, MAX_BATCH, MAX_BATCH, MAX_BATCH, 53, 26, 13, 7, 3, 2, 1] and b.n_tasks == len(sizes)


def test_batch_size_follows_the_observed_durations() -> None:
    b = Batches(_units(1000), 0.075, {"CPU": 2.0})
    first = [b.take(2000) for _ in range(3)]
    for t in first:
        b.settled(t, [0.005])
    assert len(b.take(2000)) == 15  # 75 ms of 5 ms units
    b.settled(first[0] * 4, [0.03] * 4)  # the median is now long: one unit per task
    assert len(b.take(2000)) == 1
    assert len(b.take(7)) == 1


def test_a_slow_commit_does_not_make_tiny_units_look_long() -> None:
    """Seen in CI: on a busy disk each single-unit task's fsync took over 20 ms, every unit's cost read
    long, and 200 tiny units ran as 200 tasks. Whether a class is long goes by its units' own run
    times; the cost (the commit's share included) only sizes the batch."""
    b = Batches(_units(1000), 0.1, {"CPU": 2.0})
    first = [b.take(2000) for _ in range(3)]
    for t in first:
        b.settled(t, [0.03], [0.001])  # 1 ms of work, a 29 ms commit
    assert len(b.take(2000)) == 3  # 100 ms of 30 ms costs: batched, and sized by the cost
    for t in first:
        b.settled(t * 12, [0.004] * 12, [0.001] * 12)  # the shared commit is cheap per unit
    assert len(b.take(2000)) == 25
    slow = Batches(_units(100), 0.1, {"CPU": 2.0})
    for t in [slow.take(2000) for _ in range(3)]:
        slow.settled(t, [0.031], [0.03])  # the work itself is long: never batched
    assert {len(slow.take(2000)) for _ in range(20)} == {1}


def test_long_units_cold_restarts_and_target_zero_are_never_batched() -> None:
    def sizes(b: Batches, seconds: float) -> set[int]:
        seen = set()
        while b:
            t = b.take(2000)
            seen.add(len(t))
            b.settled(t, [seconds] * len(t))
        return seen

    assert sizes(Batches(_units(50), 0.075, {"CPU": 2.0}), 0.5) == {1}
    long = Batches(_units(50), 0.075, {"CPU": 2.0})
    for _ in range(3):
        long.settled(long.take(2000), [0.5])
    assert [len(long.take(2000)) for _ in range(47)] == [1] * 47  # known long: every unit queued, as before
    assert sizes(Batches(_units(50, fresh_process=True), 0.075, {"CPU": 2.0}), 0.0001) == {1}
    assert sizes(Batches(_units(50), 0.0, {"CPU": 2.0}), 0.0001) == {1}
    cold = Batches(_units(50, fresh_process=True), 0.075, {"CPU": 2.0})
    assert all(len(cold.take(2000)) == 1 for _ in range(50))  # no limit but the window, as before batching


def test_a_lost_batch_runs_again_one_unit_per_task_first() -> None:
    b = Batches(_units(200), 0.075, {"CPU": 2.0})
    for _ in range(3):
        b.settled(b.take(2000), [0.001])
    batch = b.take(2000)
    assert len(batch) > 1
    b.settled(batch)  # lost: no durations
    b.retry_alone(batch)
    assert [b.take(2000) for _ in range(len(batch))] == [[u] for u in batch]


def test_the_batch_target_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.errors import UsageError
    from orchestrator.runner import BATCH_TARGET_S, batch_target_s

    monkeypatch.delenv("SWAPCHECK_BATCH_TARGET_S", raising=False)
    assert batch_target_s() == BATCH_TARGET_S
    monkeypatch.setenv("SWAPCHECK_BATCH_TARGET_S", "0")
    assert batch_target_s() == 0.0
    monkeypatch.setenv("SWAPCHECK_BATCH_TARGET_S", "soon")
    with pytest.raises(UsageError, match="SWAPCHECK_BATCH_TARGET_S"):
        batch_target_s()


def test_a_cancel_wrapped_by_a_library_is_a_cancel_and_nothing_else_is() -> None:
    """``ray.cancel``'s KeyboardInterrupt raised through another exception, or reported by pydantic as a
    SchemaError ending in "KeyboardInterrupt:", is a stop; a kind's own error that merely names it is the
    unit's failure."""
    from orchestrator.worker import _interrupted

    class SchemaError(Exception):
        pass

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as inner:
            raise RuntimeError("while importing") from inner
    except RuntimeError as exc:
        assert _interrupted(exc)
    assert _interrupted(SchemaError("Invalid Schema:\n  model.x\n  KeyboardInterrupt:\n"))
    assert not _interrupted(ValueError("KeyboardInterrupt handling is broken"))
    assert not _interrupted(SchemaError("Invalid Schema: a field"))


def test_a_worker_imports_no_torch_for_a_kind_that_needs_none_and_sets_a_later_torchs_threads(tmp_path: Path) -> None:
    """A fresh worker paid 1-3 s to import torch before its first unit, whatever the kind. Now a kind
    that never needs torch runs without it (the ledger still records the installed torch's version),
    and a torch a kind imports later starts with ``SWAPCHECK_THREADS_PER_UNIT`` threads."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    code = (
        "import sys, json; from tests import _group_commit_kind as probe; "
        "from orchestrator.plan import make_plan; from orchestrator.spec import parse_spec; "
        "from orchestrator.worker import execute_units; from tasks.kinds import kind_ref; "
        "from storage.store import ResultStore\n"
        "with probe.registered():\n"
        "    plan = make_plan(parse_spec(probe.spec_text('gc', 3)))\n"
        "    ps = [{**u.to_payload(), 'description': u.describe(), 'kind_ref': kind_ref(u.kind)} for u in plan.units]\n"
        "    out = execute_units(ps, sys.argv[1], plan.sweep, '0' * 64)\n"
        "    before = 'torch' in sys.modules\n"
        "    rows = ResultStore(sys.argv[1]).ledger_records(plan.sweep)\n"
        "    import torch\n"
        "    print(json.dumps({'ok': [o['status'] for o in out], 'torch_before': before, 'threads': torch.get_num_threads(),\n"
        "                      'versions': sorted({r['torch_version'] for r in rows.values()}), 'torch': torch.__version__}))\n")
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "SWAPCHECK_THREADS_PER_UNIT": "1"}
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r")], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["ok"] == ["ok"] * 3 and got["torch_before"] is False and got["threads"] == 1
    assert got["versions"] == [got["torch"]]
