"""Every worked query of docs/duckdb.md is scoped to its sweep: over a results directory holding two
sweeps of identical units it gives, for each sweep, exactly what that sweep alone gives.

The queries run through the catalog (``storage.catalog``: the views ``swapcheck query`` and
``swapcheck db`` give users). The results are a real tiny sweep (replay, cold-restart generation
with the docs' arm names ``cutlass`` and ``triton``, teacher-forced scoring), its units executed in
this process, committed under two sweep names into one directory; each sweep's directory alone is
that directory with only the sweep's partitions.

Cost: the fixture runs 8 small units (about 10 s on a loaded 2-core machine) after the tiny model's
first build imports transformers (15-20 s there, paid once per test process by every model test).
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.catalog import Catalog, open_catalog
from tests.conftest import REPO, launch_in_process

DOC = REPO / "docs" / "duckdb.md"
#: The placeholder each worked query filters on; the reader puts a sweep's name there.
PLACEHOLDER = "sweep = 'demo'"
SWEEPS = ("demo", "demo-again")

SPEC = """
question = "Do the docs' worked queries count each sweep once?"
name = "{name}"

[experiments.replay]
kind = "replay"
model = "tiny-qwen3"
capture_kernel = "int8-cutlass-order"
pairs = [["int8-cutlass-order", "int8-triton-order"]]
scale_modes = ["real", "pow2"]
prompts = {{ count = 2, length = 8, seed = 0 }}

[experiments.e2e]
kind = "generate"
model = "tiny-qwen3"
restarts = 1
prompts = {{ count = 4, length = 6, seed = 2 }}
max_new_tokens = 12

[experiments.e2e.arms.cutlass]
kernel = "int8-cutlass-order"

[experiments.e2e.arms.triton]
kernel = "int8-triton-order"
scales = "pow2"

[[experiments.e2e.teacher_forced]]
reference = "cutlass"
arms = ["triton"]
"""


def sql_blocks(text: str) -> list[str]:
    return re.findall(r"^```sql\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


QUERIES = sql_blocks(DOC.read_text(encoding="utf-8"))


def _title(sql: str) -> str:
    first = sql.splitlines()[0]
    return first.removeprefix("-- ").split(":")[0] if first.startswith("--") else first[:40]


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``pooled``: both sweeps in one results directory; each sweep's name: that sweep alone."""
    base = tmp_path_factory.mktemp("docs-queries")
    pooled = base / "pooled"
    for name in SWEEPS:
        # Stage by stage: the teacher-forced unit reads what the generate units wrote.
        summary = launch_in_process(pooled, SPEC.format(name=name), spec_path=str(base / f"{name}.toml"),
                                    restarts_here=True)
        assert summary.n_ok == summary.n_units, summary.failures
    out = {"pooled": pooled}
    for name in SWEEPS:  # the same files, only this sweep's partitions: what launching it alone writes
        alone = base / name
        for part in pooled.glob(f"table=*/sweep={name}"):
            shutil.copytree(part, alone / part.relative_to(pooled))
        out[name] = alone
    return out


@pytest.fixture(scope="module")
def catalogs(trees: dict[str, Path]) -> Iterator[dict[str, Catalog]]:
    """One open catalog per tree, as one command opens one (``swapcheck query`` over each)."""
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(open_catalog(root)) for name, root in trees.items()}


def _rows(cat: Catalog, sql: str) -> list[tuple]:
    return sorted(tuple(r.values()) for r in cat.query(sql).to_pylist())


def test_every_worked_query_is_found_and_filters_by_sweep() -> None:
    """The fast sibling of the tests below: each query filters on the placeholder, each join is on sweep."""
    assert len(QUERIES) >= 3, "docs/duckdb.md: its worked queries are ```sql blocks"
    for sql in QUERIES:
        assert PLACEHOLDER in sql, f"{_title(sql)}: filter with {PLACEHOLDER!r}"
        for on in re.findall(r"\bJOIN\b.*?\bON\b(.*?)(?:\bWHERE\b|\bGROUP\b|$)", sql, flags=re.DOTALL):
            assert re.search(r"\.sweep\s*=\s*\w+\.sweep", on), f"{_title(sql)}: join on sweep"


@pytest.mark.parametrize("sql", QUERIES, ids=[_title(q) for q in QUERIES])
def test_worked_query_over_several_sweeps_counts_each_sweep_once(catalogs: dict[str, Catalog], sql: str) -> None:
    for name in SWEEPS:
        scoped = sql.replace(PLACEHOLDER, f"sweep = '{name}'")
        alone = _rows(catalogs[name], scoped)
        assert alone, f"{_title(sql)}: no rows for {name}: the tiny sweep does not exercise this query"
        assert _rows(catalogs["pooled"], scoped) == alone, f"{_title(sql)}: {name} with another sweep present"


def test_without_the_filter_the_sweeps_would_pool(catalogs: dict[str, Catalog]) -> None:
    """The check above can fail: with the sweep filter taken out, every query's counts change once a
    second sweep of identical units is present (the bug the filter fixes)."""
    for sql in QUERIES:
        unscoped = sql.replace(PLACEHOLDER, "true")
        assert _rows(catalogs["pooled"], unscoped) != _rows(catalogs[SWEEPS[0]], unscoped), _title(sql)
