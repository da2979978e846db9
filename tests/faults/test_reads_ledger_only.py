"""Reads see only what the ledger committed (#24 item 3): no stray file is ever counted, no ledger
file counts twice, footer statistics are never trusted over bytes the ledger did not identify, a
file replaced while a command opens the catalog never fails it, and a bad ``SWAPCHECK_SPILL_DIR`` is
exit 2, not a stack dump.

The tree: for every result table two units committed by ``ResultStore.commit_unit`` (the worker's
write: files, then a ledger row recording each file's path, rows, size and SHA-256), a spec record,
a launch and a pre-registration. Each test copies it and damages the copy. The verified-files cache
lives in a per-test ``XDG_CACHE_HOME``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from storage.catalog import UNMANAGED_TABLES, Catalog, VerifiedFiles
from storage.errors import QueryError, StorageError
from storage.schemas import TABLES
from storage.store import FileRecord, ResultStore
from tests.conftest import REPO

runner = CliRunner()
SWEEP = "s"
RESULT_TABLES = sorted(t for t in TABLES if t not in UNMANAGED_TABLES)
ROWS = 3  # rows per unit file


def _value(t: pa.DataType, i: int) -> Any:
    if pa.types.is_list(t):
        return [_value(t.value_type, i)]
    if pa.types.is_struct(t):
        return {t.field(j).name: _value(t.field(j).type, i) for j in range(t.num_fields)}
    if pa.types.is_timestamp(t):
        return datetime(2025, 1, 1, tzinfo=UTC)
    if pa.types.is_boolean(t):
        return i % 2 == 0
    if pa.types.is_integer(t):
        return i
    if pa.types.is_floating(t):
        return i + 0.5
    return f"v{i}"


def _row(table: str, i: int = 0) -> dict[str, Any]:
    return {f.name: "{}" if f.name.endswith("json") else _value(f.type, i) for f in TABLES[table]}


def _rows(table: str, uid: str, n: int = ROWS) -> list[dict[str, Any]]:
    return [{**_row(table, i), "unit_id": uid, "experiment": "e"} for i in range(n)]


def _ledger_row(uid: str, table: str, records: list[FileRecord] | None, legacy: bool) -> dict[str, Any]:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    return {"unit_id": uid, "kind": table, "experiment": "e", "description": "", "params_json": "{}",
            "status": "ok", "attempts": 1, "host": "h", "pid": 1, "node_id": "n", "started_at": now,
            "finished_at": now, "duration_s": 0.1, "error": None, "tables": [table], "rows": ROWS,
            "spec_sha256": "x", "swapcheck_version": "0", "torch_version": "2",
            "files": None if legacy or records is None else [r.as_dict() for r in records]}


def uid(table: str, j: int) -> str:
    return f"{table}-{j}"


def build(root: Path, legacy: bool = False) -> None:
    """Two committed units per result table, a spec record, a launch, a pre-registration, and (as a
    launch writes it) the secret that signs the verified-files cache."""
    from storage.store import ensure_cache_key

    store = ResultStore(root)
    ensure_cache_key(store)
    store.write("sweeps", SWEEP, "spec", [{"spec_sha256": "x", "question": "q", "spec_path": "s.toml", "spec_toml": "",
                                           "n_units": 2 * len(RESULT_TABLES), "unit_ids": [],
                                           "created_at": datetime(2025, 1, 1, tzinfo=UTC)}])
    store.write("launches", SWEEP, "l1", [{**_row("launches"), "launch_id": "l1"}])
    digest = "ab" * 32
    store.write("preregistrations", SWEEP, digest[:20], [{**_row("preregistrations"), "sha256": digest}])
    for table in RESULT_TABLES:
        for j in range(2):
            u = uid(table, j)
            store.commit_unit(SWEEP, u, {table: _rows(table, u)}, functools.partial(_ledger_row, u, table, legacy=legacy))


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    out = {}
    for legacy in (False, True):
        root = tmp_path_factory.mktemp("template") / "results"
        build(root, legacy)
        out[legacy] = root
    return out


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def root(template: dict[bool, Path], tmp_path: Path) -> Path:
    out = tmp_path / "results"
    shutil.copytree(template[False], out)
    return out


def _part(root: Path, table: str, sweep: str = SWEEP) -> Path:
    return root / f"table={table}" / f"sweep={sweep}"


def _counts(cat: Catalog, tables: list[str]) -> dict[str, int]:
    sql = "SELECT " + ", ".join(f'(SELECT count(*) FROM "{t}")::BIGINT AS "{t}"' for t in tables)
    row: dict[str, int] = cat.query(sql).to_pylist()[0]
    return row


def _cli(*args: str) -> Any:
    res = runner.invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    return res


def _query(root: Path, sql: str) -> tuple[list[dict[str, Any]], str]:
    res = _cli("query", sql, "--results", str(root), "--format", "json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), res.stderr


def _warned(lines: list[str], fragment: str) -> None:
    hits = [w for w in lines if fragment in w]
    assert hits, f"no warning naming {fragment}: {lines}"
    assert all("swapcheck sweep verify --results" in w for w in hits), hits


# -- stray files in every result table: never counted, always named ------------------------------------

def _stray(root: Path, table: str, kind: str) -> str:
    """Put one stray file of ``kind`` into ``table``; return the fragment its warning names."""
    part = _part(root, table)
    genuine = part / f"{uid(table, 0)}.parquet"
    if kind == "ghost_sweep":  # a sweep with no ledger partition at all
        ghost = _part(root, table, "ghost")
        ghost.mkdir(parents=True)
        shutil.copy(genuine, ghost / "x.parquet")
        return f"table={table}/sweep=ghost/"
    if kind == "unledgered":  # a well-formed file of the sweep no ledger row names
        pq.write_table(pa.Table.from_pylist(_rows(table, "forged", 5), schema=TABLES[table]), part / "x.parquet")
        return f"table={table}/sweep={SWEEP}/x.parquet"
    if kind == "renamed_copy":  # a genuine file copied under another name
        shutil.copy(genuine, part / "copy.parquet")
        return f"table={table}/sweep={SWEEP}/copy.parquet"
    if kind == "other_table":  # another table's file copied in, named as a unit of this one would be
        other = RESULT_TABLES[(RESULT_TABLES.index(table) + 1) % len(RESULT_TABLES)]
        shutil.copy(_part(root, other) / f"{uid(other, 0)}.parquet", part / f"{uid(table, 9)}.parquet")
        return f"table={table}/sweep={SWEEP}/{uid(table, 9)}.parquet"
    if kind == "symlink":  # a link to a genuine file of the same partition
        (part / "link.parquet").symlink_to(genuine)
        return f"table={table}/sweep={SWEEP}/link.parquet"
    if kind == "other_table_over":  # another table's file copied over a genuine file (not the same bytes)
        other = RESULT_TABLES[(RESULT_TABLES.index(table) + 1) % len(RESULT_TABLES)]
        shutil.copy(_part(root, other) / f"{uid(other, 0)}.parquet", genuine)
        return f"table={table}/sweep={SWEEP}/{genuine.name}"
    raise AssertionError(kind)


STRAYS = ["ghost_sweep", "unledgered", "renamed_copy", "other_table", "symlink", "other_table_over"]


@pytest.mark.parametrize("kind", STRAYS)
def test_a_stray_file_in_every_result_table_is_never_counted_and_always_named(root: Path, kind: str) -> None:
    named = [_stray(root, table, kind) for table in RESULT_TABLES]
    with Catalog(root) as cat:
        counts = _counts(cat, RESULT_TABLES)
        damaged = {r["unit_id"] for r in cat.query("SELECT unit_id FROM units WHERE damaged").to_pylist()}
        for fragment in named:
            _warned(cat.warnings, fragment)
        assert cat.all_sweeps() == [SWEEP]
    if kind == "other_table_over":  # the genuine file is gone: its unit is flagged, the rest are counted
        assert counts == {t: ROWS for t in RESULT_TABLES}
        assert damaged == {uid(t, 0) for t in RESULT_TABLES}
    else:
        assert counts == {t: 2 * ROWS for t in RESULT_TABLES}
        assert damaged == set()


@pytest.mark.parametrize("kind", ["ghost_sweep", "renamed_copy", "symlink"])
def test_a_stray_file_through_the_cli(root: Path, kind: str) -> None:
    fragment = _stray(root, "kdepth", kind)
    rows, stderr = _query(root, "SELECT count(*)::BIGINT AS n FROM kdepth")
    assert rows == [{"n": 2 * ROWS}]
    assert "warning:" in stderr and fragment in stderr
    if kind == "ghost_sweep":
        res = _cli("report", "units", "--results", str(root), "--format", "json")
        assert res.exit_code == 0 and "ghost" not in res.stdout


# -- the ledger and the tables no ledger row names ------------------------------------------------------

def _units(cat: Catalog) -> tuple[int, int]:
    row = cat.query("SELECT count(*)::BIGINT AS n, count(*) FILTER (WHERE damaged)::BIGINT AS d FROM units").to_pylist()[0]
    return row["n"], row["d"]


def _rewrite(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


LEDGER_STRAYS = ["copy", "two_rows", "zero_rows", "other_unit_inside", "copy_into_ghost_sweep"]


@pytest.mark.parametrize("kind", LEDGER_STRAYS)
def test_a_ledger_file_counts_only_as_the_one_row_of_the_unit_it_is_named_after(root: Path, kind: str) -> None:
    total = 2 * len(RESULT_TABLES)
    ledger = _part(root, "units")
    first = ledger / f"{uid('kdepth', 0)}.parquet"
    rows = pq.read_table(first).to_pylist()
    expect_units, expect_damaged = total, 0
    if kind == "copy":  # the reproduced case: 121 units for a 120-unit sweep
        shutil.copy(first, ledger / "copy.parquet")
        fragment = "units/sweep=s/copy.parquet"
    elif kind == "two_rows":  # the unit's row twice: not one record
        _rewrite(first, rows * 2, pq.read_schema(first))
        fragment, expect_units = first.name, total - 1
    elif kind == "zero_rows":
        _rewrite(first, [], pq.read_schema(first))
        fragment, expect_units = first.name, total - 1
    elif kind == "other_unit_inside":  # a copy of another unit's ledger file under a genuine unit's name
        shutil.copy(ledger / f"{uid('kdepth', 1)}.parquet", first)
        fragment, expect_units = first.name, total - 1
    else:  # a sweep's ledger file copied into another sweep's ledger: its files are of sweep s
        (root / "table=units" / "sweep=t").mkdir()
        shutil.copy(first, root / "table=units" / "sweep=t" / first.name)
        fragment, expect_units, expect_damaged = "path_escape", total + 1, 1
    with Catalog(root) as cat:
        assert _units(cat) == (expect_units, expect_damaged)
        _warned(cat.warnings, fragment)
        if kind in ("two_rows", "zero_rows", "other_unit_inside"):  # kdepth-0's rows are no longer committed
            assert _counts(cat, ["kdepth"]) == {"kdepth": ROWS}
        else:
            assert _counts(cat, ["kdepth"]) == {"kdepth": 2 * ROWS}


def test_a_misnamed_ledger_copy_through_report_units(root: Path) -> None:
    shutil.copy(_part(root, "units") / f"{uid('kdepth', 0)}.parquet", _part(root, "units") / "copy.parquet")
    res = _cli("report", "units", "--results", str(root), "--format", "json")
    assert res.exit_code == 0 and "copy.parquet" in res.stderr
    rows, _ = _query(root, "SELECT count(*)::BIGINT AS n FROM units")
    assert rows == [{"n": 2 * len(RESULT_TABLES)}]


UNMANAGED_STRAYS = ["launch_of_a_sweep_without_spec", "launch_copy", "prereg_copy", "sweeps_extra_file",
                    "spec_two_rows", "prereg_of_a_sweep_without_spec"]


@pytest.mark.parametrize("kind", UNMANAGED_STRAYS)
def test_tables_no_ledger_row_names_are_checked_too(root: Path, kind: str) -> None:
    expect = {"sweeps": 1, "launches": 1, "preregistrations": 1}
    if kind == "launch_of_a_sweep_without_spec":
        (_part(root, "launches", "ghost")).mkdir()
        shutil.copy(_part(root, "launches") / "l1.parquet", _part(root, "launches", "ghost") / "l1.parquet")
        fragment = "table=launches/sweep=ghost/"
    elif kind == "prereg_of_a_sweep_without_spec":
        src = next(_part(root, "preregistrations").iterdir())
        _part(root, "preregistrations", "ghost").mkdir()
        shutil.copy(src, _part(root, "preregistrations", "ghost") / src.name)
        fragment = "table=preregistrations/sweep=ghost/"
    elif kind == "launch_copy":
        shutil.copy(_part(root, "launches") / "l1.parquet", _part(root, "launches") / "l2.parquet")
        fragment = "launches/sweep=s/l2.parquet"
    elif kind == "prereg_copy":
        src = next(_part(root, "preregistrations").iterdir())
        shutil.copy(src, src.with_name("0" * 20 + ".parquet"))
        fragment = "0" * 20
    elif kind == "sweeps_extra_file":
        shutil.copy(_part(root, "sweeps") / "spec.parquet", _part(root, "sweeps") / "spec2.parquet")
        fragment = "spec2.parquet"
    else:
        spec = _part(root, "sweeps") / "spec.parquet"
        _rewrite(spec, pq.read_table(spec).to_pylist() * 2, pq.read_schema(spec))
        fragment, expect = "spec.parquet", {"sweeps": 0, "launches": 0, "preregistrations": 0}
    with Catalog(root) as cat:
        assert _counts(cat, list(expect)) == expect
        _warned(cat.warnings, fragment)
        assert "ghost" not in cat.all_sweeps()


# -- footer statistics are never trusted over unidentified bytes -----------------------------------------

def _footer(path: Path) -> tuple[int, int]:
    """(start, length) of the Thrift footer of a Parquet file."""
    data = path.read_bytes()
    n = int.from_bytes(data[-8:-4], "little")
    return len(data) - 8 - n, n


def _stat_offsets(path: Path, value: str) -> list[int]:
    """Offsets inside the footer where ``value`` (a min/max statistic of unit_id) is stored."""
    data = path.read_bytes()
    start, n = _footer(path)
    out, i = [], data.find(value.encode(), start)
    while 0 <= i < start + n:
        out.append(i)
        i = data.find(value.encode(), i + 1)
    return out


def _flip(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


#: Where to flip a bit: in each stored unit_id statistic (first and last byte), and at spread points of
#: the footer (field headers, lengths, other statistics).
FLIPS = [("stat", 0, 0), ("stat", 0, -1), ("stat", 1, 0), ("stat", 1, -1), ("stat", -1, 0),
         ("footer", 0.1, 0), ("footer", 0.3, 3), ("footer", 0.5, 1), ("footer", 0.7, 6), ("footer", 0.9, 2)]


def _flip_case(root: Path, where: str, which: float, edge: int) -> Path:
    victim = _part(root, "kdepth") / f"{uid('kdepth', 0)}.parquet"
    if where == "stat":
        offsets = _stat_offsets(victim, uid("kdepth", 0))
        assert offsets, "the footer stores unit_id statistics"
        at = offsets[int(which)] + (len(uid("kdepth", 0)) - 1 if edge == -1 else 0)
        _flip(victim, at, 0)
    else:
        start, n = _footer(victim)
        _flip(victim, start + int(n * which), edge)
    return victim


def _sql(u: str) -> str:
    return f"SELECT count(*)::BIGINT AS n FROM kdepth WHERE unit_id = '{u}'"


@pytest.mark.parametrize(("where", "which", "edge"), FLIPS)
def test_a_flipped_footer_bit_never_gives_a_wrong_count(root: Path, where: str, which: float, edge: int) -> None:
    victim = _flip_case(root, where, which, edge)
    u = uid("kdepth", 0)
    rows, stderr = _query(root, _sql(u))
    # The count is right, or the file is refused: a warning naming it, and its unit flagged damaged.
    assert rows == [{"n": ROWS}] or (rows == [{"n": 0}] and victim.name in stderr and "warning:" in stderr), (rows, stderr)
    with Catalog(root) as cat:
        n = cat.query(_sql(u)).to_pylist()[0]["n"]
        flagged = cat.query(f"SELECT damaged FROM units WHERE unit_id = '{u}'").to_pylist()
        assert n == ROWS or (n == 0 and flagged == [{"damaged": True}] and any(victim.name in w for w in cat.warnings))
        assert cat.query(_sql(uid("kdepth", 1))).to_pylist() == [{"n": ROWS}]


@pytest.mark.parametrize(("where", "which", "edge"), FLIPS[::2])
def test_a_flipped_footer_bit_in_a_legacy_file_never_gives_a_wrong_count(
        template: dict[bool, Path], tmp_path: Path, where: str, which: float, edge: int) -> None:
    """Ledger rows without SHA-256 records: nothing identifies the bytes, so the file is read whole at
    open (no statistics used) — the count is right, or the file is refused with a warning."""
    root = tmp_path / "legacy"
    shutil.copytree(template[True], root)
    victim = _flip_case(root, where, which, edge)
    with Catalog(root) as cat:
        n = cat.query(_sql(uid("kdepth", 0))).to_pylist()[0]["n"]
        assert n == ROWS or (n == 0 and any(victim.name in w for w in cat.warnings)), (n, cat.warnings)


# -- the verified-files cache ------------------------------------------------------------------------------

def test_the_second_open_hashes_nothing_and_the_cache_lives_outside_the_results(root: Path, _own_cache: Path) -> None:
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with Catalog(root) as cat:
        assert cat.hashed == 2 * len(RESULT_TABLES) and cat.warnings == []
    with Catalog(root) as cat:
        assert cat.hashed == 0 and _counts(cat, ["kdepth"]) == {"kdepth": 2 * ROWS}
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before, "nothing written into the results"
    (cache,) = (_own_cache / "swapcheck" / "verified").iterdir()
    assert str(root) not in cache.read_text(), "the cache does not name the results root"


def test_a_file_rewritten_with_size_and_mtime_restored_is_hashed_again_and_refused(root: Path) -> None:
    """Same size, same mtime (restored with os.utime), same inode: only the ctime tells — and it does."""
    with Catalog(root):
        pass
    victim = _part(root, "kdepth") / f"{uid('kdepth', 0)}.parquet"
    st = victim.stat()
    with open(victim, "r+b") as fh:  # in place: the inode stays
        fh.seek(_stat_offsets(victim, uid("kdepth", 0))[0])
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 1]))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = victim.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    with Catalog(root) as cat:
        assert cat.hashed == 1
        assert cat.query(_sql(uid("kdepth", 0))).to_pylist() == [{"n": 0}]
        _warned(cat.warnings, victim.name)


def test_a_file_replaced_by_identical_bytes_is_hashed_again_and_read(root: Path) -> None:
    with Catalog(root):
        pass
    victim = _part(root, "kdepth") / f"{uid('kdepth', 0)}.parquet"
    tmp = victim.with_name(".x")
    shutil.copy2(victim, tmp)
    os.replace(tmp, victim)  # a new inode, the same bytes and mtime
    with Catalog(root) as cat:
        assert cat.hashed == 1 and cat.warnings == []
        assert cat.query(_sql(uid("kdepth", 0))).to_pylist() == [{"n": ROWS}]


@pytest.mark.parametrize("kind", ["unwritable", "a_file", "corrupt", "nested", "relative_xdg"])
def test_a_cache_that_cannot_be_used_is_never_fatal(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    kind: str) -> None:
    """An unusable cache costs hashing, never the read: an unreadable one (``corrupt``; ``nested``: deeper
    than the JSON parser's stack, a RecursionError) is ignored with one warning and rewritten (issue #36)."""
    cache = tmp_path / "cache"
    if kind == "unwritable":
        cache.mkdir()
        cache.chmod(0o500)
    elif kind == "a_file":
        cache.write_text("not a directory")
    elif kind in ("corrupt", "nested"):
        with Catalog(root):
            pass
        (entry,) = (cache / "swapcheck" / "verified").iterdir()
        entry.write_text("{not json" if kind == "corrupt" else "[" * 200_000)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
    try:
        for i in range(2):
            with Catalog(root) as cat:
                assert _counts(cat, ["kdepth"]) == {"kdepth": 2 * ROWS}
                if kind in ("corrupt", "nested") and i == 0:
                    (warning,) = cat.warnings
                    assert "verified-files cache" in warning and "ignored: not valid JSON" in warning
                else:
                    assert cat.warnings == []
        if kind == "nested":  # and the CLI answers with the warning, no stack dump
            entry.write_text("[" * 200_000)
            res = runner.invoke(app, ["query", "SELECT count(*) AS n FROM kdepth", "--results", str(root),
                                      "--format", "json"])
            assert res.exit_code == 0 and json.loads(res.stdout) == [{"n": 2 * ROWS}], res.output
            assert "verified-files cache" in res.stderr and "Traceback" not in res.output
        if kind == "relative_xdg":  # a relative XDG_CACHE_HOME is ignored (the XDG rule): ~/.cache
            assert (tmp_path / "home" / ".cache" / "swapcheck" / "verified").is_dir()
            assert not (root.parent / "relative").exists() and not Path("relative/cache").exists()
    finally:
        if cache.is_dir():
            cache.chmod(0o700)


def test_a_cache_entry_never_trusts_bytes_the_ledger_did_not_record(root: Path, _own_cache: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A forged cache entry for a changed file (as after bit rot under an unchanged identity): the
    cache matches only with the ledger's SHA-256 and row count; an entry older than the rehash age
    (``SWAPCHECK_REHASH_AFTER_S``) is not trusted, so the rotten file is hashed again and never read;
    and ``sweep verify``, which hashes every file whatever the cache says, names it."""
    victim = _part(root, "kdepth") / f"{uid('kdepth', 0)}.parquet"
    meta = pq.ParquetFile(victim).metadata
    column = meta.row_group(0).column(meta.schema.names.index("unit_id"))
    chunk = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    start = chunk + column.total_compressed_size - 2  # inside the last page's body, not its header
    data = bytearray(victim.read_bytes())
    data[start] ^= 0x5A
    victim.write_bytes(bytes(data))
    store = ResultStore(root)
    rel = victim.relative_to(root).as_posix()
    record = pq.read_table(_part(root, "units") / victim.name).column("files")[0].as_py()[0]
    recorded, rows = record["sha256"], record["rows"]

    def forge(sha256: str, rows: int, age_s: float = 0.0) -> None:
        cache = VerifiedFiles(store)
        cache.add(rel, cache.identity(rel, None), sha256, rows, True)
        cache._new[rel]["read_ns"] -= int(age_s * 1e9)
        cache.save()

    def caught() -> bool:
        with Catalog(root) as cat:
            return cat.hashed >= 1 and any(victim.name in w for w in cat.warnings)

    forge(hashlib.sha256(bytes(data)).hexdigest(), rows)  # the wrong hash
    assert caught()
    forge(recorded, rows + 1)  # the ledger's hash, another row count
    assert caught()
    forge(recorded, rows, age_s=VerifiedFiles.REHASH_DEFAULT_S + 60)  # the ledger's, but a day old
    assert caught()
    forge(recorded, rows)  # the ledger's hash, fresh: hashed again only when every open must hash
    monkeypatch.setenv(VerifiedFiles.REHASH_ENV, "0")
    assert caught()
    monkeypatch.setenv(VerifiedFiles.REHASH_ENV, "-1")
    res = _cli("query", _sql(uid("kdepth", 0)), "--results", str(root))
    assert res.exit_code == 2 and VerifiedFiles.REHASH_ENV in res.output, res.output
    monkeypatch.delenv(VerifiedFiles.REHASH_ENV)
    res = _cli("sweep", "verify", "--results", str(root))
    assert res.exit_code != 0 and victim.name in res.output, res.output


def test_a_cache_entry_written_without_the_trees_secret_is_not_trusted(root: Path, _own_cache: Path) -> None:
    """Issue #36: an entry forged in the cache file itself -- the changed file's identity with the ledger's
    SHA-256 and row count, fresh -- made ``query`` serve the changed rows without a word. Entries are
    signed with the tree's secret: the forged one does not verify, one warning says so, the file is
    hashed and the damage named."""
    import json

    victim = _part(root, "kdepth") / f"{uid('kdepth', 0)}.parquet"
    rel = victim.relative_to(root).as_posix()
    with Catalog(root) as cat:  # a genuine open: every file hashed, the signed cache written
        assert cat.hashed > 0 and not cat.warnings
    (path,) = (_own_cache / "swapcheck" / "verified").iterdir()
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x5A
    victim.write_bytes(bytes(data))
    cache = json.loads(path.read_text())
    entry = cache["files"][rel]
    entry["identity"] = VerifiedFiles(ResultStore(root)).identity(rel, None)  # the changed file's, as a forger sets it
    path.write_text(json.dumps(cache))
    with Catalog(root) as cat:
        assert cat.hashed == 1, cat.hashed  # that file alone: hashed, not trusted
        text = "\n".join(cat.warnings)
        assert "1 entry does not carry this results tree's signature" in text and victim.name in text, text


def test_a_tree_without_the_secret_is_hashed_at_every_open_and_never_written(root: Path, _own_cache: Path) -> None:
    """A reader never writes the secret (``query`` changes nothing in the tree); without one the cache
    is not used."""
    (root / VerifiedFiles.KEY).unlink()
    before = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    hashed = []
    for _ in range(2):
        with Catalog(root) as cat:
            hashed.append(cat.hashed)
    assert hashed[0] == hashed[1] > 0
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == before


# -- a file replaced while the catalog opens ----------------------------------------------------------------

def _real_tree(root: Path) -> str:
    """A tiny kdepth sweep launched in-process (6 units, its spec record and launch record)."""
    from tests.conftest import launch_in_process, tiny_spec_text

    summary = launch_in_process(root, tiny_spec_text(name="race", seeds=1))
    assert summary.n_ok == summary.n_units == 6, summary.failures
    return summary.sweep


def _race(root: Path, sweep: str, opens: int, reports: int, units: int) -> None:
    """Open the catalog ``opens`` times (and ``report all`` ``reports`` times) while a thread rewrites
    the launches file and a ledger file in a loop, as a running launch does: 0 failures."""
    store = ResultStore(root)
    # The tree's own launch records and l1 (written below, or rewritten where the tree has it).
    launches = len({Path(p).name for p in store.parquet_files("launches", sweep)} | {"l1.parquet"})
    row = {**_row("launches"), "launch_id": "l1", "provenance_json": "{}", "status": "running"}
    store.write("launches", sweep, "l1", [row])
    ledger = sorted(_part(root, "units", sweep).iterdir())[0]
    ledger_row = pq.read_table(ledger).to_pylist()[0]
    stop = threading.Event()
    writes = [0]

    def rewrite() -> None:
        while not stop.is_set():
            writes[0] += 1
            # Another size each time (as running -> finished does): a reader holding the old size
            # would look for the footer in the wrong place.
            store.write("launches", sweep, "l1", [{**row, "n_ok": writes[0], "status": "running" + "." * (writes[0] % 7)}])
            store.record_unit(sweep, ledger_row)
            stop.wait(0.002)  # let the reader run too (one interpreter lock)

    thread = threading.Thread(target=rewrite, daemon=True)
    thread.start()
    failures: list[str] = []
    try:
        for i in range(opens):
            try:
                with Catalog(root) as cat:  # several queries per open, as a report runs (the files change meanwhile)
                    for _ in range(4):
                        got = cat.query("SELECT count(*)::BIGINT AS n, max(status) AS s FROM launches").to_pylist()[0]
                        assert got["n"] == launches and cat.warnings == [], (got, cat.warnings)
                        assert _units(cat) == (units, 0)
                        time.sleep(0.003)
                if reports and i % (opens // reports) == 0:
                    res = runner.invoke(app, ["report", "all", "--results", str(root), "--format", "json"])
                    assert res.exit_code == 0 and "warning" not in res.stderr, res.output[-2000:]
            except Exception as exc:  # noqa: BLE001 - counted, reported below
                failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        stop.set()
        thread.join()
    assert writes[0] > 5, "the writer ran while the catalog opened"
    assert failures == []


@pytest.mark.slow  # 20 opens under a rewriting thread (about 6 s); the slow set also runs report all during a launch
def test_a_launches_file_rewritten_in_a_loop_never_fails_an_open(root: Path) -> None:
    _race(root, SWEEP, opens=20, reports=0, units=2 * len(RESULT_TABLES))


@pytest.mark.slow
def test_report_all_during_a_running_launch_never_fails(tmp_path: Path) -> None:
    """The reproduced case (2/60 failures: "Couldn't deserialize thrift"): 50 opens, 5 `report all`."""
    root = tmp_path / "results"
    _race(root, _real_tree(root), opens=50, reports=5, units=6)


# -- the spill directory ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["missing", "a_file"])
def test_a_bad_spill_dir_is_exit_2_naming_the_variable_and_the_path(root: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    spill = tmp_path / "spill"
    if kind == "a_file":
        spill.write_text("x")
    monkeypatch.setenv("SWAPCHECK_SPILL_DIR", str(spill))
    res = _cli("query", "SELECT 1 AS one", "--results", str(root))
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "SWAPCHECK_SPILL_DIR" in lines[0] and str(spill) in res.output.replace("\n", "")
    with pytest.raises(StorageError, match="SWAPCHECK_SPILL_DIR"):
        Catalog(root)


# -- DuckDB's own reader over the verified files (issue #25) --------------------------------------------------

def test_a_native_read_never_imports_pyarrow_dataset(root: Path) -> None:
    """The pyarrow route's import (0.4 s) is paid only where it scans: a local tree's open and query
    (every table queried, the unmanaged ones included) never imports ``pyarrow.dataset``."""
    import subprocess
    import sys

    code = ("import sys; from storage.catalog import Catalog; from storage.schemas import TABLES; "
            "cat = Catalog(sys.argv[1]); "
            "[cat.query(f'SELECT count(*) FROM \"{t}\"') for t in TABLES]; assert cat.native; "
            "print('pyarrow.dataset' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code, str(root)], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_views_scan_natively_with_the_declared_types_and_the_same_rows(root: Path) -> None:
    """A local tree is scanned by DuckDB's own Parquet reader: each view has the declared columns and
    types, in order, and the same rows as through pyarrow datasets (the object-store path)."""
    import storage.catalog as catalog

    def read(native: bool) -> dict[str, Any]:
        orig = catalog.native_scan
        if not native:
            catalog.native_scan = lambda store, bound: False
        try:
            with Catalog(root) as cat:
                assert cat.native is native
                return {t: (cat.query(f'DESCRIBE "{t}"').select(["column_name", "column_type"]).to_pylist(),
                            cat.query(f'SELECT * FROM "{t}" ORDER BY ALL').to_pylist()) for t in TABLES}
        finally:
            catalog.native_scan = orig

    assert read(True) == read(False)


def test_a_later_open_reads_no_file_of_a_verified_tree(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first open hashes and checks every file; a later one only stats them (no hash, no footer,
    no ledger file read: its rows come from the cache) and reads the same rows."""
    from storage import catalog

    with Catalog(root) as cat:
        first = _counts(cat, RESULT_TABLES + ["units"]), cat.query("SELECT * FROM units ORDER BY ALL").to_pylist()
    opened: list[str] = []
    real = catalog._Binder._read

    def spy(self: Any, w: Any, whole: bool) -> Any:
        opened.append(w.rel)
        return real(self, w, whole)

    monkeypatch.setattr(catalog._Binder, "_read", spy)
    with Catalog(root) as cat:
        assert cat.hashed == 0 and cat.warnings == []
        again = _counts(cat, RESULT_TABLES + ["units"]), cat.query("SELECT * FROM units ORDER BY ALL").to_pylist()
    assert again == first
    assert not [rel for rel in opened if rel.startswith(("table=units/", "table=kdepth/"))], opened


def test_a_file_replaced_after_the_open_fails_the_query_instead_of_being_read(root: Path) -> None:
    """DuckDB opens files by path at query time: a result file replaced (or rewritten) after the
    catalog verified it fails the query, naming the file, rather than feeding it unverified bytes."""
    victim = _part(root, "kdepth") / f"{uid('kdepth', 0)}.parquet"
    with Catalog(root) as cat:
        assert cat.query(_sql(uid("kdepth", 0))).to_pylist() == [{"n": ROWS}]
        data = victim.read_bytes()
        tmp = victim.with_name(".replacement")
        tmp.write_bytes(data)  # the same bytes under a new inode: still not what was verified
        os.replace(tmp, victim)
        with pytest.raises(QueryError, match=f"{victim.name}.*changed after this command verified it"):
            cat.query(_sql(uid("kdepth", 0)))
        with pytest.raises(QueryError, match="changed after"):
            cat.named_arrow("kdepth_summary", sweep=SWEEP)


def test_sql_cannot_write_a_bound_file(root: Path) -> None:
    """The bound files are the connection's allowed paths (reads); a COPY onto one is refused by the
    statement allow-list (exit 2), the file unchanged; reading another file of the tree is refused."""
    victim = _part(root, "kdepth") / f"{uid('kdepth', 0)}.parquet"
    before = victim.read_bytes()
    for sql in (f"COPY (SELECT 1 AS x) TO '{victim}' (FORMAT parquet, USE_TMP_FILE false)",
                f"EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{victim}' (USE_TMP_FILE false)"):
        res = _cli("query", sql, "--results", str(root))
        assert res.exit_code == 2, res.output
    assert victim.read_bytes() == before
    stray = _part(root, "kdepth") / "stray.parquet"
    shutil.copy(victim, stray)
    res = _cli("query", f"SELECT count(*) FROM read_parquet('{stray}')", "--results", str(root))
    assert res.exit_code == 2 and "Permission" in res.output, res.output


def test_a_root_with_glob_characters_is_read_through_pyarrow(template: dict[bool, Path], tmp_path: Path) -> None:
    """DuckDB's readers expand ``*``, ``?`` and ``[`` in a path: a results root holding one is scanned
    through pyarrow datasets instead, with the same rows."""
    root = tmp_path / "results[1]"
    shutil.copytree(template[False], root)
    with Catalog(root) as cat:
        assert not cat.native
        assert _counts(cat, ["kdepth"]) == {"kdepth": 2 * ROWS} and cat.warnings == []
