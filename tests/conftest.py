"""Shared fixtures: real Ray (embedded, loopback only), real Parquet and DuckDB, tiny specs."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

# Tests talk only to 127.0.0.1: make Ray bind to loopback before anything imports it.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_AUTH_MODE", "token")
# The CLI prints full-width tables when stdout is not a terminal unless COLUMNS says otherwise;
# pytest-xdist's workers start with COLUMNS=80 / LINES=24 set, so tests there run without them
# (a test of COLUMNS sets it itself).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
# Ray workers inherit the environment of the instance's start, so fixtures' env is set here.
os.environ.setdefault("SWAPCHECK_TEST_CRASH_DIR", tempfile.mkdtemp(prefix="swapcheck-crash-"))
# The catalog's verified-files cache (storage.catalog.VerifiedFiles) goes to $XDG_CACHE_HOME: not the home directory.
os.environ.setdefault("XDG_CACHE_HOME", tempfile.mkdtemp(prefix="swapcheck-cache-"))

if TYPE_CHECKING:
    from orchestrator.runner import LaunchSummary
    from orchestrator.spec import LoadedSpec

REPO = Path(__file__).resolve().parents[1]


# Hypothesis: `ci` (chosen where CI=true) draws the same examples on every run, so a CI failure is
# reproducible from its log and no run depends on a cold example database; `dev` (the default)
# explores new examples each run and keeps the failing ones in .hypothesis/. Tests that need more or
# fewer examples set max_examples themselves. HYPOTHESIS_PROFILE=name chooses explicitly.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def _warm_numba() -> None:
    """Compile the numba kernels once per test run, before any test or worker starts: every test
    process, CLI subprocess and Ray worker then loads them from numba's cache (``__pycache__``)
    instead of each compiling them (a clean clone has no cache). The two halves compile in
    parallel; on a warm cache this takes a second or two."""
    if os.environ.get("SWAPCHECK_NUMBA", "1") == "0":
        return
    procs = [subprocess.Popen([sys.executable, "-c", f"from tasks.numerics.warmup import warm; warm({part!r})"],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for part in ("ordered", "exact")]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:  # the tests of the compiled paths will say what is wrong
            sys.stderr.write(f"warming numba's cache failed (exit {proc.returncode}):\n{err[-2000:]}\n")


def pytest_configure(config: pytest.Config) -> None:
    # One intra-op thread: results are deterministic and a shared 2-core machine is not thrashed by
    # OpenMP spinning (units in sweeps run with one thread each for the same reason).
    import torch

    torch.set_num_threads(1)
    if not hasattr(config, "workerinput") and not config.option.collectonly:  # once: the xdist controller
        _warm_numba()


@pytest.fixture(autouse=True)
def _one_torch_thread() -> None:
    """Every test starts with one intra-op thread, even after a test that changed it and did not
    restore it (pytest_configure sets it once per process, xdist workers included)."""
    import torch  # already imported by pytest_configure

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


TINY_SPEC = """
question = "Do the INT8 epilogue orders agree on tiny shapes?"
name = "{name}"

[experiments.int8]
kind = "kdepth"
dtype = "int8"
implementations = {impls}
scale_modes = ["real", "pow2"]
m = 16
n = 24
k = {{ start = 32, stop = 128, factor = 2 }}
seeds = {seeds}
"""


KILL_SPEC = """
question = "{question}"
name = "{name}"

[experiments.int8]
kind = "kdepth"
dtype = "int8"
implementations = {impls}
scale_modes = ["real", "pow2"]
m = 64
n = {n}
k = {{ start = 64, stop = 8192, factor = 2 }}
seeds = {seeds}
"""


KILL_IMPLS = '["int8-cutlass-order", "int8-triton-order", "int8-torch-channelwise"]'


def kill_spec_text(name: str, seeds: int, n: int = 64,
                   question: str = "Does a sweep survive faults around its launch?", impls: str = KILL_IMPLS) -> str:
    """A sweep long enough (8 K values x 2 scale modes x seeds units) to be killed while it runs."""
    return textwrap.dedent(KILL_SPEC.format(name=name, n=n, seeds=seeds, question=question, impls=impls))


def tiny_spec_text(name: str = "tiny", impls: str = '["int8-cutlass-order", "int8-triton-order"]', seeds: int = 2) -> str:
    return textwrap.dedent(TINY_SPEC.format(name=name, impls=impls, seeds=seeds))


def launch_in_process(results: str | Path, spec: str | Path | LoadedSpec, *, spec_path: str = "<string>",
                      restarts_here: bool = False, **kw: Any) -> LaunchSummary:
    """Launch ``spec`` into ``results`` as ``swapcheck sweep launch`` does, in this process, no Ray:
    :func:`orchestrator.runner.launch` with ``in_process=True`` (the launch lock, the sweep's spec record,
    a launch record with provenance, pre-registrations, every unit through the worker's own commit path,
    stage by stage; a relaunch skips what is committed).

    ``spec`` is spec text (``str``, parsed as if read from ``spec_path``, which places relative
    pre-registration paths), a spec file (``Path``) or a parsed spec. ``kw`` goes to ``launch``
    (``on_event``, ``repair``, ``budget_s``). Returns the :class:`LaunchSummary` and asserts nothing:
    a failed unit is ``n_failed``/``failures``, so callers assert what they expect (all ok:
    ``summary.n_ok == summary.n_units``). A unit's own outcome comes with ``on_event``'s ``unit`` events.

    The runner refuses in process the units that need a process of their own (``generate``'s cold
    restarts); ``restarts_here=True`` runs them here too, one after another. Their ids, records and rows
    are the same; what they lose is the fresh process, so a test OF restart isolation launches on Ray.
    """
    import dataclasses

    import orchestrator.runner
    from orchestrator.plan import Plan, make_plan
    from orchestrator.spec import LoadedSpec, load_spec, parse_spec

    loaded = spec if isinstance(spec, LoadedSpec) else load_spec(spec) if isinstance(spec, Path) else parse_spec(spec, spec_path)
    with pytest.MonkeyPatch.context() as patch:
        if restarts_here:
            def plan_here(spec: LoadedSpec) -> Plan:
                plan = make_plan(spec)
                return Plan(plan.sweep, plan.spec_sha256, [dataclasses.replace(u, fresh_process=False) for u in plan.units])

            patch.setattr(orchestrator.runner, "make_plan", plan_here)
        return orchestrator.runner.launch(loaded, results, in_process=True, **kw)


@pytest.fixture
def tiny_spec(tmp_path: Path) -> Path:
    p = tmp_path / "tiny.toml"
    p.write_text(tiny_spec_text())
    return p


@pytest.fixture(scope="session")
def ray_local():
    """One embedded Ray instance for the in-process tests (starting Ray costs seconds)."""
    from orchestrator.cluster import connect, disconnect

    conn = connect(num_cpus=2)
    yield conn
    disconnect()


@pytest.fixture(scope="module")
def ledgered_writes() -> Iterator[None]:
    """For tests that write result files by hand with ``ResultStore.write``: each such write of a
    result table also commits it, as the worker's ``commit_unit`` would — the ``ok`` ledger row of the
    unit named like the file records every file of that name (path, rows, size, SHA-256). The catalog
    reads only what the ledger committed (docs/reliability.md), so uncommitted files would be ignored.
    Use with ``pytestmark = pytest.mark.usefixtures("ledgered_writes")``."""
    from datetime import UTC, datetime

    import pyarrow.parquet as pq

    from storage.schemas import UNMANAGED_TABLES
    from storage.store import ResultStore

    write = ResultStore.write

    def committed(self: ResultStore, table: str, sweep: str, name: str, rows: object) -> object:
        record = write(self, table, sweep, name, rows)  # type: ignore[arg-type]
        if table in UNMANAGED_TABLES:
            return record
        ledger = Path(self.base) / "table=units" / f"sweep={sweep}" / f"{name}.parquet"
        old = pq.read_table(ledger).to_pylist()[0]["files"] if self.local and ledger.exists() else []
        files = [f for f in old or [] if f["path"] != record.path] + [record.as_dict()]
        now = datetime.now(UTC)
        write(self, "units", sweep, name, [{
            "unit_id": name, "kind": table, "experiment": "e", "status": "ok", "attempts": 1, "started_at": now,
            "finished_at": now, "tables": sorted({f["table"] for f in files}), "rows": sum(f["rows"] for f in files),
            "files": files}])
        return record

    with pytest.MonkeyPatch.context() as patch:  # module scope: before the modules' own result fixtures
        patch.setattr(ResultStore, "write", committed)
        yield
