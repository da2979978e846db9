"""The spec record (``table=sweeps/sweep=<s>/spec.parquet``) says which plan a sweep partition holds.

Damaged, it stops a plain launch with exit 2 naming it (nothing written); missing or damaged, the
sweep's ledger must hold only units of the spec being launched, so a different spec under the same
name is refused even when the record that would have said so is gone. ``--repair`` writing the record
anew is measured by tests/faults/test_campaign.py (the ``sweeps-*`` cases).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from tests.conftest import launch_in_process, tiny_spec_text
from tests.faults.test_small_faults import tree_hash

SWEEP = "rec"
cli = CliRunner()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spec-record") / "results"
    summary = launch_in_process(root, tiny_spec_text(name=SWEEP, seeds=1))
    assert summary.n_ok == summary.n_units == 6, summary.failures
    return root


@pytest.fixture
def tree(pristine: Path, tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "results"
    shutil.copytree(pristine, root)
    spec = tmp_path / "s.toml"
    spec.write_text(tiny_spec_text(name=SWEEP, seeds=1))
    return spec, root


def _record(root: Path) -> Path:
    return root / f"table=sweeps/sweep={SWEEP}/spec.parquet"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped", "empty"])
def test_a_damaged_spec_record_stops_a_plain_launch_naming_it(tree: tuple[Path, Path], damage: str) -> None:
    spec, root = tree
    p = _record(root)
    data = bytearray(p.read_bytes())
    if damage == "garbage":
        data = bytearray(b"x" * len(data))
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":  # a byte of the spec's text in its data page (a page checksum covers it)
        import pyarrow.parquet as pq

        md = pq.ParquetFile(p).metadata.row_group(0)
        col = next(md.column(i) for i in range(md.num_columns) if md.column(i).path_in_schema == "spec_toml")
        data[(col.dictionary_page_offset or col.data_page_offset) + 80] ^= 0xFF  # past the page header
    else:
        data = bytearray()
    p.write_bytes(bytes(data))
    before = tree_hash(root)
    res = cli.invoke(app, ["sweep", "launch", str(spec), "--results", str(root), "--no-progress"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit)
    assert "spec.parquet" in res.output and "--repair" in res.output and "Nothing was written" in res.output
    assert tree_hash(root) == before


@pytest.mark.parametrize("gone", ["deleted", "damaged"])
def test_another_spec_under_the_same_name_is_refused_without_its_record(tree: tuple[Path, Path], gone: str) -> None:
    spec, root = tree
    if gone == "deleted":
        _record(root).unlink()
    else:
        _record(root).write_bytes(b"PAR1 not really")
    other = spec.with_name("other.toml")
    other.write_text(tiny_spec_text(name=SWEEP, seeds=1, impls='["int8-cutlass-order", "int8-torch-channelwise"]'))
    before = tree_hash(root)
    args = ["sweep", "launch", str(other), "--results", str(root), "--no-progress"]
    res = cli.invoke(app, [*args, "--repair"] if gone == "damaged" else args)
    assert res.exit_code == 2, res.output
    assert "this spec does not plan" in res.output and "new `name`" in res.output
    assert tree_hash(root) == before
