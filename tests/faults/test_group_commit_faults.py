"""Group commit under faults (issue #25): tiny units share Ray tasks and one durable commit per batch,
and still no fault loses a finished unit or duplicates a row.

On a real embedded Ray instance (loopback), with the ``gc_probe`` kind (tests/_group_commit_kind.py):
a worker SIGKILLed mid-batch (Ray re-runs the batch), a unit that kills every worker it runs on (its
batch is split, only it fails), a stop mid-batch, the driver SIGKILLed mid-sweep; and which units are
batched at all. Rows are counted against the planned count, with DuckDB and with pyarrow.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from orchestrator.errors import Interrupted
from orchestrator.runner import StopSignals, launch
from orchestrator.spec import parse_spec
from storage.catalog import read_only_query
from storage.store import ResultStore
from tests import _group_commit_kind as probe
from tests.conftest import REPO


@pytest.fixture(autouse=True)
def _gc_probe_kind() -> Iterator[None]:
    with probe.registered():
        yield


COMMITTED = re.compile(r"(\d+) of (\d+) units are committed")


def _spec(name: str, units: int, **kw: Any) -> Any:
    return parse_spec(probe.spec_text(name, units, **kw))


def _counts(results: Path, sweep: str) -> dict[str, int]:
    """Rows of ``gc_probe`` (all files, with pyarrow; and through the catalog, with DuckDB), distinct
    units among them, and the ledger's units and ok units."""
    table = pq.read_table(results / f"table={probe.TABLE}" / f"sweep={sweep}")
    duck = read_only_query(results, f"SELECT count(*) AS n, count(DISTINCT unit_id) AS u FROM {probe.TABLE}").to_pylist()[0]
    ledger = ResultStore(results).ledger(sweep)
    return {"rows": table.num_rows, "units": len(set(table.column("unit_id").to_pylist())), "duck_rows": duck["n"],
            "duck_units": duck["u"], "ledger": len(ledger), "ok": sum(1 for r in ledger.values() if r["status"] == "ok")}


def _events() -> tuple[list[int], Any]:
    """Batch sizes of the ``unit`` events a launch emits, and the ``on_event`` that records them."""
    sizes: list[int] = []

    def on_event(kind: str, info: dict[str, Any]) -> None:
        if kind == "unit":
            sizes.append(int(info["batch"]))

    return sizes, on_event


@pytest.mark.slow
def test_a_worker_sigkilled_mid_batch_loses_and_duplicates_nothing(ray_local: Any, tmp_path: Path,
                                                                  fault_outcome: Any) -> None:
    n = 400
    spec = _spec("gc-kill", n, kill=[250], kill_dir=str(tmp_path))
    results = tmp_path / "results"
    sizes, on_event = _events()
    summary = launch(spec, results, on_event=on_event)
    marker = tmp_path / "killed-250"
    assert marker.is_file() and int(marker.read_text()) != os.getpid(), "a worker was SIGKILLed"
    assert (summary.n_ok, summary.n_failed) == (n, 0)
    assert summary.n_tasks < n // 4 and max(sizes) > 1, "the units ran in batches"
    counts = _counts(results, "gc-kill")
    records = ResultStore(results).ledger_records("gc-kill")
    killed = next(r for r in records.values() if '"i":250,' in r["params_json"])
    again = [r for r in records.values() if r["attempts"] == 2]
    # The killed unit's whole batch ran again (every unit of it has two attempt markers); nothing else did.
    assert killed["attempts"] == 2 and 1 <= len(again) <= max(sizes)
    relaunch = launch(spec, results)
    assert (relaunch.n_skipped, relaunch.n_ok) == (n, 0)
    after = _counts(results, "gc-kill")
    fault_outcome(lost=n - after["ok"], duplicated=after["rows"] - after["units"], silent_wrong=int(after != counts),
                  stage="worker SIGKILL mid-batch", batch_tasks=summary.n_tasks, reran=len(again))
    assert counts == after == {"rows": n, "units": n, "duck_rows": n, "duck_units": n, "ledger": n, "ok": n}
    from storage import verify

    assert verify.verify(ResultStore(results), "gc-kill") == []


@pytest.mark.slow
def test_a_unit_that_kills_every_worker_fails_alone_and_its_batch_mates_commit(ray_local: Any, tmp_path: Path,
                                                                              fault_outcome: Any) -> None:
    n = 300
    spec = _spec("gc-poison", n, max_retries=1, kill_always=[200])
    results = tmp_path / "results"
    summary = launch(spec, results)
    assert (summary.n_ok, summary.n_failed) == (n - 1, 1)
    (failed_id, error), = summary.failures
    records = ResultStore(results).ledger_records("gc-poison")
    assert '"i":200,' in records[failed_id]["params_json"] and "worker lost" in error
    # Its batch ran twice (Ray's one retry), then it ran alone twice: four attempts, then a failed row.
    assert records[failed_id]["attempts"] == 4 and records[failed_id]["status"] == "failed"
    counts = _counts(results, "gc-poison")
    fault_outcome(lost=(n - 1) - counts["ok"], duplicated=counts["rows"] - counts["units"], silent_wrong=0,
                  stage="a unit that kills every worker, in a batch")
    assert counts == {"rows": n - 1, "units": n - 1, "duck_rows": n - 1, "duck_units": n - 1, "ledger": n, "ok": n - 1}


@pytest.mark.slow
def test_tiny_units_are_batched_cold_restarts_and_long_units_never(ray_local: Any, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    sizes, on_event = _events()
    tiny = launch(_spec("gc-tiny", 200), tmp_path / "tiny", on_event=on_event)
    assert tiny.n_ok == 200 and tiny.n_tasks < 200 // 4 and len(sizes) == 200
    assert sizes.count(1) <= 16  # the first tasks (before three units have finished) and the tail
    sizes.clear()
    cold = launch(_spec("gc-cold", 3, fresh_process=True), tmp_path / "cold", on_event=on_event)
    assert cold.n_ok == 3 and cold.n_tasks == 3 and sizes == [1] * 3
    sizes.clear()
    long = launch(_spec("gc-long", 16, seconds=0.03), tmp_path / "long", on_event=on_event)
    assert long.n_ok == 16 and long.n_tasks == 16 and sizes == [1] * 16
    monkeypatch.setenv("SWAPCHECK_BATCH_TARGET_S", "0")
    off = launch(_spec("gc-off", 20), tmp_path / "off")
    assert off.n_ok == 20 and off.n_tasks == 20


def _when(condition: Any, then: Any, timeout: float = 120) -> threading.Thread:
    """Run ``then`` in a thread as soon as ``condition()`` holds (polled every 20 ms)."""

    def watch() -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if condition():
                    then()
                    return
            except (OSError, ValueError):  # the tree is being written meanwhile: look again
                pass
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_a_stop_mid_batch_counts_what_the_ledger_holds_and_a_relaunch_finishes(ray_local: Any, tmp_path: Path,
                                                                             fault_outcome: Any) -> None:
    n = 600
    spec = _spec("gc-stop", n, seconds=0.004)  # batches of ~100 ms
    results = tmp_path / "results"

    def interrupt() -> None:
        if isinstance(getattr(signal.getsignal(signal.SIGINT), "__self__", None), StopSignals):
            os.kill(os.getpid(), signal.SIGINT)  # only while the launch's handler holds it

    _when(lambda: len(ResultStore(results).done_units("gc-stop")) >= 100, interrupt)
    with pytest.raises(Interrupted) as info:
        launch(spec, results)
    printed = int(COMMITTED.search(str(info.value)).group(1))  # type: ignore[union-attr]
    time.sleep(1.0)  # nothing commits after the launch has returned
    ledger = ResultStore(results).ledger("gc-stop")
    assert printed == len(ledger) == sum(1 for r in ledger.values() if r["status"] == "ok")
    assert 100 <= printed < n, "the stop landed mid-sweep"
    summary = launch(spec, results)
    assert (summary.n_skipped, summary.n_ok, summary.n_failed) == (printed, n - printed, 0)
    counts = _counts(results, "gc-stop")
    fault_outcome(lost=n - counts["ok"], duplicated=counts["rows"] - counts["units"], silent_wrong=0,
                  stage="SIGINT mid-batch", printed=printed)
    assert counts == {"rows": n, "units": n, "duck_rows": n, "duck_units": n, "ledger": n, "ok": n}


CLI = ("import sys; sys.path.insert(0, {repo!r}); from tests._group_commit_kind import register; register(); "
       "from orchestrator.cli.main import app; app()")


@pytest.mark.slow
def test_the_driver_sigkilled_mid_batch_then_a_relaunch_loses_and_duplicates_nothing(tmp_path: Path,
                                                                                     fault_outcome: Any) -> None:
    n = 1200
    spec = tmp_path / "gc.toml"
    spec.write_text(probe.spec_text("gc-driver", n, seconds=0.002))
    results = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}
    cmd = [sys.executable, "-c", CLI.format(repo=str(REPO)), "sweep", "launch", str(spec), "--results", str(results),
           "--no-progress", "--num-cpus", "2"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    store = ResultStore(results)
    deadline = time.time() + 240
    while time.time() < deadline and len(store.done_units("gc-driver")) < 150:
        assert proc.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray instance it started, mid-batch
    proc.wait()
    time.sleep(2)  # any orphaned worker finishes (or dies) meanwhile
    before = store.ledger("gc-driver")
    assert 150 <= len(before) < n
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    counts = _counts(results, "gc-driver")
    fault_outcome(lost=n - counts["ok"], duplicated=counts["rows"] - counts["units"], silent_wrong=0,
                  stage="driver SIGKILL mid-batch", committed_before=len(before))
    assert counts == {"rows": n, "units": n, "duck_rows": n, "duck_units": n, "ledger": n, "ok": n}
