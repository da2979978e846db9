"""Bytes changed under an intact footer: the file keeps its size and metadata, only data pages differ.

Size, footer, schema and row count cannot see this; the ledger's SHA-256 can: the catalog identifies
each file before reading it, so the file is refused with a warning pointing at `sweep verify` instead
of returning wrong sums — and `sweep verify` names the file (checksum). The page CRCs the store writes
are still verified on every read (bytes changed after a file was identified)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

from orchestrator.cli.main import app
from orchestrator.plan import make_plan
from orchestrator.spec import parse_spec
from orchestrator.worker import execute_unit
from tests.conftest import tiny_spec_text

cli = CliRunner()


def _results(root: Path) -> str:
    spec = parse_spec(tiny_spec_text(name="crc", seeds=1))
    plan = make_plan(spec)
    for u in plan.units[:2]:
        assert execute_unit({**u.to_payload(), "description": u.describe()}, str(root), plan.sweep, spec.sha256)["status"] == "ok"
    return plan.sweep


def _corrupt_a_data_page(path: Path) -> None:
    meta = pq.ParquetFile(path).metadata
    column = meta.row_group(0).column(meta.schema.names.index("max_abs_error"))
    start = column.data_page_offset + 40  # inside the page body, past its header
    data = bytearray(path.read_bytes())
    for i in range(start, start + 8):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def test_a_page_changed_under_an_intact_footer_fails_the_read_and_verify_names_it(tmp_path: Path) -> None:
    root = tmp_path / "results"
    _results(root)
    before = cli.invoke(app, ["query", "SELECT count(*)::BIGINT AS n FROM kdepth", "--results", str(root), "--format", "json"])
    assert before.exit_code == 0 and json.loads(before.stdout) == [{"n": 6}]
    victim = sorted((root / "table=kdepth" / "sweep=crc").glob("*.parquet"))[0]
    size = victim.stat().st_size
    _corrupt_a_data_page(victim)
    assert victim.stat().st_size == size and pq.ParquetFile(victim).metadata.num_rows == 3  # footer intact

    # The catalog identifies each file by the ledger's SHA-256 before reading it: the file is refused
    # with a warning and its unit flagged (never read). The page CRCs stay on for bytes that change
    # after a file was identified (tests/faults/test_reads_ledger_only.py, the forged cache entry).
    res = cli.invoke(app, ["query", "SELECT count(*)::BIGINT AS n FROM kdepth", "--results", str(root), "--format", "json"])
    assert res.exit_code == 0 and json.loads(res.stdout) == [{"n": 3}], res.output
    assert victim.name in res.stderr and "SHA-256" in res.stderr and "sweep verify" in res.stderr
    rep = cli.invoke(app, ["report", "kdepth", "--results", str(root), "--format", "json"])
    assert rep.exit_code == 0 and "sweep verify" in rep.stderr
    found = cli.invoke(app, ["sweep", "verify", "--results", str(root), "--format", "json"])
    assert found.exit_code == 1
    assert [(p["path"], p["kind"]) for p in json.loads(found.stdout)] == [
        (f"table=kdepth/sweep=crc/{victim.name}", "checksum")]
