"""Records read and checked once, kept by file identity on this machine (storage.readcache, issue #39).

A relaunch of a finished sweep reuses what an earlier one read of the ledger checkpoint (its unit ids
and statuses) and of the spec record, while those files keep their identity; everything else reads
them whole: another identity, an entry not signed with the tree's secret, an entry older than
``SWAPCHECK_REHASH_AFTER_S``, and ``sweep verify`` always. A kept read whose file is later needed
whole checks the file's bytes then, and refuses bytes that changed under an unchanged identity.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from storage.errors import StorageError
from storage.records import SweepRecords
from storage.store import ResultStore
from tests.conftest import launch_in_process, tiny_spec_text

SWEEP = "rc"


def _launched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compact: bool) -> Path:
    """A finished sweep whose launch ended with a checkpoint (and, ``compact``, compacted result
    files), and a cache directory of the test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SWAPCHECK_CHECKPOINT_FROM", "1")
    monkeypatch.setenv("SWAPCHECK_COMPACT_FROM", "1" if compact else "0")
    root = tmp_path / "results"
    summary = launch_in_process(root, tiny_spec_text(SWEEP))
    assert summary.n_ok == summary.n_units > 4
    assert list((root / f"table=units/sweep={SWEEP}/_checkpoints").glob("*.parquet"))
    assert bool(list((root / f"table=kdepth/sweep={SWEEP}").glob("c-*.parquet"))) == compact
    return root


@pytest.fixture
def finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return _launched(tmp_path, monkeypatch, compact=False)


def _read(root: Path) -> tuple[Any, Any]:
    records = SweepRecords(ResultStore(root), SWEEP)
    cp = records.current_checkpoint()
    assert cp is not None
    return records, records.read_checkpoint(cp)


def test_a_second_reader_reuses_the_checkpoint_and_spec_record_read_before(finished: Path) -> None:
    records, first = _read(finished)
    assert first.ok and not first.from_cache  # read whole by the launch's store only: this store reads it again
    records2, second = _read(finished)
    assert second.ok and second.from_cache
    assert second.keys.equals(first.keys) and second.created_by == first.created_by
    assert second.table.equals(first.table)  # the whole file, read and checked when needed
    assert records2.claimed_ids().equals(records.claimed_ids())
    assert ResultStore(finished).read_ledger(SWEEP).done() == records.read_ledger().done()


def test_verify_never_uses_it(finished: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from storage import readcache, verify

    _read(finished)
    calls: list[str] = []
    real = readcache.ReadCache.get
    monkeypatch.setattr(readcache.ReadCache, "get", lambda self, *a: calls.append(a[0]) or real(self, *a))
    assert _read(finished)[1].from_cache and calls  # a reader asks it (the spy sees it)
    calls.clear()
    store = ResultStore(finished)
    assert [p for p in verify.verify(store, SWEEP) if p.damage] == []
    assert calls == [] and store.use_read_cache


def test_another_identity_an_unsigned_entry_or_an_old_one_reads_the_file(finished: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _read(finished)
    assert _read(finished)[1].from_cache
    cp = next((finished / f"table=units/sweep={SWEEP}/_checkpoints").glob("*.parquet"))
    cp.write_bytes(cp.read_bytes())  # the same bytes, written again: another identity (ctime)
    assert not _read(finished)[1].from_cache
    assert _read(finished)[1].from_cache  # kept anew
    kept = list((finished.parent / "cache" / "swapcheck" / "reads").glob("*.arrows"))
    assert kept
    for f in kept:  # an entry forged without the tree's secret: its signature does not verify
        head, _, body = f.read_bytes().partition(b"\n")
        header = json.loads(head)
        header["mac"] = "0" * 64
        f.write_bytes(json.dumps(header).encode() + b"\n" + body)
    assert not _read(finished)[1].from_cache
    assert _read(finished)[1].from_cache
    monkeypatch.setenv("SWAPCHECK_REHASH_AFTER_S", "0")  # every entry too old: every record read whole
    assert not _read(finished)[1].from_cache


def test_bytes_changed_under_an_unchanged_identity_are_refused_when_the_file_is_read(
        finished: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records, first = _read(finished)
    identity = first.identity
    cp = next((finished / f"table=units/sweep={SWEEP}/_checkpoints").glob("*.parquet"))
    data = bytearray(cp.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cp.write_bytes(bytes(data))
    # bit rot that kept the identity (what no user call can do: ctime moves on any write)
    monkeypatch.setattr(SweepRecords, "_identity", lambda self, path: identity if path.endswith(cp.name)
                        else SweepRecords.__dict__["_identity"](self, path))
    _, kept = _read(finished)
    assert kept.from_cache and kept.ok
    with pytest.raises(StorageError, match="though its identity is unchanged"):
        _ = kept.table


def test_a_relaunch_of_the_finished_sweep_reads_neither_record_again(finished: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from storage import store as store_mod

    launch_in_process(finished, tiny_spec_text(SWEEP))  # the first relaunch keeps what it read
    reads: list[str] = []
    real = store_mod.ResultStore._read_bytes
    monkeypatch.setattr(store_mod.ResultStore, "_read_bytes", lambda self, p: reads.append(p) or real(self, p))
    real_table = store_mod.ResultStore.read_table
    monkeypatch.setattr(store_mod.ResultStore, "read_table",
                        lambda self, p, **kw: reads.append(p) or real_table(self, p, **kw))
    summary = launch_in_process(finished, tiny_spec_text(SWEEP))
    assert summary.n_skipped == summary.n_units and summary.n_ok == 0
    assert not [p for p in reads if "_checkpoints" in p or "table=sweeps" in p]


@pytest.fixture
def compacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return _launched(tmp_path, monkeypatch, compact=True)


def _answers(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], int]:
    """What a user reads through the catalog, and how many sweeps were bound in Arrow (not kept)."""
    from storage import catalog

    bound: list[str] = []
    real = catalog._Binder._compacted_wants
    monkeypatch.setattr(catalog._Binder, "_compacted_wants", lambda self, s, rows: bound.append(s) or real(self, s, rows))
    with catalog.open_catalog(str(root)) as cat:
        units = cat.query("SELECT * EXCLUDE (started_at, finished_at) FROM units ORDER BY unit_id").to_pylist()
        rows = cat.query("SELECT unit_id, impl_a, impl_b, k, differing FROM kdepth ORDER BY ALL").to_pylist()
        answers = {"units": units, "rows": rows, "warnings": list(cat.warnings)}
    monkeypatch.setattr(catalog._Binder, "_compacted_wants", real)
    return answers, len(bound)


def test_a_catalog_reuses_the_binding_of_unchanged_compacted_files(compacted: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The second open of an unchanged compacted sweep binds nothing (the kept binding: no decode of
    the checkpoint's file records, no footer read) and reads the same answers; the units view scans
    the checkpoint at query time."""
    first, n_first = _answers(compacted, monkeypatch)
    assert n_first == 1 and first["warnings"] == [] and len(first["units"]) > 4
    assert all(u["status"] == "ok" and not u["damaged"] for u in first["units"])
    again, n_again = _answers(compacted, monkeypatch)
    assert n_again == 0 and again == first
    monkeypatch.setenv("SWAPCHECK_REHASH_AFTER_S", "0")  # nothing kept is trusted: bound again, the same
    fresh, n_fresh = _answers(compacted, monkeypatch)
    assert n_fresh == 1 and fresh == first


def test_a_rewritten_compacted_file_is_bound_again(compacted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, _ = _answers(compacted, monkeypatch)
    (cfile,) = (compacted / f"table=kdepth/sweep={SWEEP}").glob("c-*.parquet")
    cfile.write_bytes(cfile.read_bytes())  # the same bytes, another identity
    again, n_again = _answers(compacted, monkeypatch)
    assert n_again == 1 and again == first


def test_bit_rot_under_a_kept_binding_marks_the_files_units_damaged(compacted: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A compacted file whose bytes changed while its identity did not (what no user call can do) is
    found by its SHA-256 once its verified entry is older than SWAPCHECK_REHASH_AFTER_S; the units it
    holds are named damaged although the kept binding listed none of them."""
    from storage import catalog

    first, _ = _answers(compacted, monkeypatch)
    (cfile,) = (compacted / f"table=kdepth/sweep={SWEEP}").glob("c-*.parquet")
    rel = cfile.relative_to(compacted).as_posix()
    real_identity = catalog.VerifiedFiles.identity
    kept = real_identity(catalog.VerifiedFiles(ResultStore(compacted)), rel, None)
    data = bytearray(cfile.read_bytes())
    data[len(data) // 3] ^= 0xFF
    cfile.write_bytes(bytes(data))
    monkeypatch.setattr(catalog.VerifiedFiles, "identity",
                        lambda self, r, info: kept if r == rel else real_identity(self, r, info))
    from storage import readcache

    # the kept binding is trusted (as if kept a moment ago); the verified-files entry is not: re-hashed
    monkeypatch.setattr(readcache.ReadCache, "__init__", _fresh_reads(readcache.ReadCache.__init__))
    monkeypatch.setenv("SWAPCHECK_REHASH_AFTER_S", "0")
    bound: list[str] = []
    real = catalog._Binder._compacted_wants
    monkeypatch.setattr(catalog._Binder, "_compacted_wants", lambda self, s, rows: bound.append(s) or real(self, s, rows))
    with catalog.open_catalog(str(compacted)) as cat:
        damaged = cat.query("SELECT count(*) AS n FROM units WHERE damaged").to_pylist()[0]["n"]
        assert any(rel in w and "damaged" in w for w in cat.warnings)
    assert bound == []  # the binding was the kept one: the damaged units were found from the checkpoint
    assert damaged == len(first["units"]) > 0


def _fresh_reads(init: Any) -> Any:
    """ReadCache.__init__ that trusts every kept read whatever its age (the verified-files cache
    does not: the test's SWAPCHECK_REHASH_AFTER_S=0 applies to it alone)."""
    def wrapped(self: Any, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        self._fresh_ns = 0
    return wrapped
