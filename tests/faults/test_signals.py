"""SIGINT and SIGTERM during a launch, and the count a stopping launch prints (issue #24, items 6 and 7).

- A signal never raises inside Ray's wait: an exception raised by a handler there comes out of Ray's
  C++ core as ``SystemError ... CoreWorker.wait`` (reproduced below with a raising handler), so the
  runner's handlers only record while it waits, and the wait loop stops when it sees one.
- Stopping cancels the units in flight and waits for them to settle before counting, from the ledger:
  the printed ``N of M units are committed`` is what the ledger holds once the process has exited.
- A results store failing mid-sweep is one error line, not a worker traceback per unit in flight.

The in-process cases run in the default set (the session's Ray instance); the seeded subprocess
cases, each a real driver with an embedded Ray instance, are ``slow``.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import Interrupted, StorageFailure, Terminated
from orchestrator.runner import StopSignals, _ready, launch
from orchestrator.spec import parse_spec
from storage.catalog import read_only_query
from storage.store import ResultStore
from tests.conftest import REPO, kill_spec_text, tiny_spec_text

SLOW_IMPLS = '["int8-cutlass-order", "tests.kernel_fixtures:SlowKernel"]'
COMMITTED = re.compile(r"(\d+) of (\d+) units are committed")
NOT_CLEAN = ("Traceback", "SystemError", "Unhandled error", "Stack trace", "*** ")


def _ledger_counts(results: Path, sweep: str) -> tuple[int, int]:
    """(units with a ledger row, units whose row says ok) of ``sweep``."""
    ledger = ResultStore(results).ledger(sweep)
    return len(ledger), sum(1 for r in ledger.values() if r["status"] == "ok")


def _when(condition: Callable[[], bool], then: Callable[[], None], timeout: float = 120) -> threading.Thread:
    """Run ``then`` in a thread as soon as ``condition()`` holds (polled every 50 ms)."""

    def watch() -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if condition():
                    then()
                    return
            except (OSError, ValueError):  # the tree is being written meanwhile: look again
                pass
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _kill_self(signum: int) -> Callable[[], None]:
    """Signal this process, but only while a launch's handler holds the signal: never the test runner."""

    def kill() -> None:
        if isinstance(getattr(signal.getsignal(signum), "__self__", None), StopSignals):
            os.kill(os.getpid(), signum)

    return kill


# -- the handlers ------------------------------------------------------------------------------------

@pytest.fixture
def stop() -> Any:
    signals = StopSignals()
    signals.install()
    yield signals
    signals.restore()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_outside_the_wait_a_signal_raises_terminated_and_restore_puts_the_old_handler_back(signum: int) -> None:
    before = signal.getsignal(signum)
    stop = StopSignals()
    stop.install()
    try:
        with pytest.raises(Terminated) as info:
            os.kill(os.getpid(), signum)
            time.sleep(1)  # the handler runs in the main thread before this returns
        assert info.value.signum == signum and stop.signum == signum
    finally:
        stop.restore()
    assert signal.getsignal(signum) is before


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_ray_wait_is_recorded_not_raised(ray_local: Any, stop: StopSignals, signum: int) -> None:
    import ray

    @ray.remote
    def nap() -> int:
        time.sleep(2)
        return 1

    ref = nap.remote()
    timer = threading.Timer(0.3, _kill_self(signum))
    with stop.deferred():
        timer.start()
        t0 = time.monotonic()
        ready = _ready({ref: None}, stop, timeout=1.5)  # type: ignore[dict-item]
    assert stop.signum == signum and ready == []
    assert time.monotonic() - t0 >= 1.0, "the wait went on: the handler recorded and returned"
    assert ray.get(ref) == 1


def test_a_handler_raising_inside_ray_wait_is_a_system_error_and_folded_while_stopping(ray_local: Any) -> None:
    """The cause of the reproduced stack dump, and the runner's fold of it: a handler that raises (as
    the runner's own SIGTERM handler did) while Ray's wait runs makes the wait raise SystemError when
    it lands in Ray's core (or the handler's exception when it lands in Python); while stopping,
    either is the stop."""
    import ray

    @ray.remote
    def nap() -> int:
        time.sleep(3)
        return 1

    def raising(signum: int, frame: Any) -> None:
        raise Terminated(signal.SIGTERM)

    previous = signal.signal(signal.SIGALRM, raising)
    try:
        refs = {nap.remote(): None, nap.remote(): None}
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises((SystemError, Terminated)) as info:
            _ready(refs, StopSignals(), timeout=1.0)  # type: ignore[arg-type]
        if isinstance(info.value, SystemError):
            assert "CoreWorker.wait" in str(info.value)
        for _ in range(2):  # wherever it lands, while stopping it is folded
            stopping = StopSignals()
            stopping.received.append(signal.SIGTERM)
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            assert _ready(refs, stopping, timeout=0.5) == []  # type: ignore[arg-type]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert ray.get(list(refs)) == [1, 1]


# -- in-process launches (the session's Ray instance) ----------------------------------------------

def _slow_spec(name: str, seeds: int = 2) -> Any:
    return parse_spec(tiny_spec_text(name=name, impls=SLOW_IMPLS, seeds=seeds))


@pytest.mark.slow  # a real launch stopped mid-sweep; the handler and fold tests above run by default
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_launch_stops_and_the_printed_count_is_the_ledgers(ray_local: Any, tmp_path: Path, signum: int,
                                                                       fault_outcome: Any) -> None:
    spec = _slow_spec(f"sig{signum}")
    results = tmp_path / "results"
    sweep = spec.sweep.name
    _when(lambda: len(ResultStore(results).done_units(sweep)) >= 2, _kill_self(signum))
    with pytest.raises(Interrupted) as info:
        launch(spec, results, num_cpus=2)
    message = str(info.value)
    assert info.value.exit_code == 128 + signum
    assert message.startswith(signal.Signals(signum).name) and "Relaunch the same spec to resume" in message
    assert "\n" not in message
    printed = int(COMMITTED.search(message).group(1))  # type: ignore[union-attr]
    committed, ok = _ledger_counts(results, sweep)
    time.sleep(1.0)  # nothing commits after the launch has returned: every unit was cancelled or settled
    assert (printed, printed) == (committed, ok) == _ledger_counts(results, sweep)
    assert 2 <= printed < 12, "the signal landed mid-sweep"
    launches = [r for p in ResultStore(results).parquet_files("launches", sweep)
                for r in ResultStore(results).read_table(p).to_pylist()]
    assert [r["status"] for r in launches] == ["interrupted"]
    summary = launch(spec, results, num_cpus=2)
    assert (summary.n_skipped, summary.n_ok, summary.n_failed) == (printed, 12 - printed, 0)
    dupes = read_only_query(results, "SELECT unit_id, impl_a, impl_b, count(*) AS c FROM kdepth GROUP BY ALL HAVING c > 1")
    fault_outcome(lost=12 - len(ResultStore(results).done_units(sweep)), duplicated=dupes.num_rows, silent_wrong=0,
                  stage=f"{signal.Signals(signum).name} in-process", printed=printed, ledger=committed)
    assert dupes.num_rows == 0 and len(ResultStore(results).done_units(sweep)) == 12


def _break_attempts(results: Path, sweep: str) -> None:
    """Make the attempt-marker directory a file: every unit that starts now fails to write (a
    storage fault; root ignores chmod). Workers may re-create it meanwhile: move each aside."""
    attempts = results / "_state" / "attempts" / f"sweep={sweep}"
    for i in range(200):
        try:
            if attempts.is_dir():
                attempts.rename(attempts.with_name(f"moved-{i}"))
            with open(attempts, "x") as fh:
                fh.write("not a directory")
            return
        except (FileExistsError, IsADirectoryError, FileNotFoundError):
            continue


def test_a_storage_fault_mid_launch_is_one_line_and_the_count_is_the_ledgers(ray_local: Any, tmp_path: Path,
                                                                            capfd: pytest.CaptureFixture[str]) -> None:
    spec = _slow_spec("diskfault")
    results = tmp_path / "results"
    sweep = spec.sweep.name
    _when(lambda: len(ResultStore(results).done_units(sweep)) >= 2, lambda: _break_attempts(results, sweep))
    with pytest.raises(StorageFailure) as info:
        launch(spec, results, num_cpus=2)
    message = str(info.value)
    assert info.value.exit_code == 3 and "\n" not in message
    assert "could not commit its results" in message and "fix the storage" in message
    printed = int(COMMITTED.search(message).group(1))  # type: ignore[union-attr]
    time.sleep(1.0)
    assert (printed, printed) == _ledger_counts(results, sweep)
    ledger = ResultStore(results).ledger(sweep)
    assert all(r["status"] == "ok" for r in ledger.values()), "no unit is blamed for the disk"
    err = capfd.readouterr().err
    assert not any(s in err for s in NOT_CLEAN), err[-3000:]


# -- real drivers, seeded signal times (slow) --------------------------------------------------------

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _default_signals() -> None:
    """In the driver: SIGINT at its default disposition and unblocked, whatever the test runner did
    (see test_launch_faults._default_sigint)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _driver(spec: Path, results: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", *extra, "sweep", "launch", str(spec),
                             "--results", str(results), "--no-progress", "--num-cpus", "2"],
                            cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_signals)


def _started(proc: subprocess.Popen[str], timeout: float = 240) -> str:
    """Read the driver's stderr up to its start line (Ray is up, its handlers are installed)."""
    assert proc.stderr is not None
    seen = ""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
        if "to run" in line:
            return seen
    raise AssertionError(f"the launch never started: {seen[-2000:]}")


def _schedule(i: int) -> tuple[int, int, float]:
    """Case ``i``: (signal, units this launch commits first, then seconds), seeded. Case 0 signals
    0-4 s after the start line without waiting for a unit (Ray's workers are still starting: the
    signal lands before or while the first units are submitted); cases 1-3 after 1-12 newly committed
    units and 0-0.8 s more (units in flight, some committing as the signal lands)."""
    rng = random.Random(20261202 + i)
    signum = rng.choice([signal.SIGINT, signal.SIGTERM])
    if i < 1:
        return signum, 0, round(rng.uniform(0.0, 4.0), 2)
    return signum, rng.randint(1, 12), round(rng.uniform(0.0, 0.8), 2)


SCHEDULE = [_schedule(i) for i in range(3)]  # three launches: the slow set's time is budgeted


@pytest.mark.slow
def test_seeded_signals_stop_cleanly_print_the_ledgers_count_and_a_relaunch_finishes(tmp_path: Path,
                                                                                     fault_outcome: Any) -> None:
    """Three launches of one sweep, each stopped by SIGINT or SIGTERM at a seeded point (:func:`_schedule`:
    before the first unit commits, or after a seeded number of units, with units in flight): each exits
    130 / 143 with one summary line and no stack dump, prints the count the ledger holds once it has
    exited, and records its launch as interrupted; a last relaunch finishes with nothing lost or
    duplicated."""
    seeds = 4
    total = 8 * 2 * seeds
    spec = tmp_path / "spec.toml"
    spec.write_text(kill_spec_text("seeded", seeds=seeds, impls=SLOW_IMPLS))
    results = tmp_path / "results"
    mismatches = []
    store = ResultStore(results)
    for i, (signum, units, delay) in enumerate(SCHEDULE):
        done_before = store.done_units("seeded") if results.exists() else set()
        proc = _driver(spec, results)
        head = _started(proc)
        deadline = time.time() + 240
        while units and len(store.done_units("seeded") - done_before) < units:
            assert proc.poll() is None and time.time() < deadline, f"case {i}: the launch ended or made no progress"
            time.sleep(0.05)
        time.sleep(delay)
        proc.send_signal(signum)
        _, tail = proc.communicate(timeout=180)
        stderr = head + tail
        case = f"case {i}: {signal.Signals(signum).name} after {units} units and {delay} s"
        assert proc.returncode == 128 + signum, (case, stderr[-3000:])
        assert not any(s in stderr for s in NOT_CLEAN), (case, stderr[-3000:])
        summary = [line for line in stderr.splitlines() if "units are committed" in line]
        assert len(summary) == 1 and "Relaunch the same spec to resume" in summary[0], (case, stderr[-3000:])
        printed = int(COMMITTED.search(summary[0]).group(1))  # type: ignore[union-attr]
        after_exit = _ledger_counts(results, "seeded")
        time.sleep(0.5)
        wrong = (printed, printed) != after_exit or _ledger_counts(results, "seeded") != after_exit
        if wrong:
            mismatches.append((case, printed, after_exit, _ledger_counts(results, "seeded")))
        twice = read_only_query(results, "SELECT unit_id, impl_a, impl_b, count(*) AS c FROM kdepth GROUP BY ALL "
                                         "HAVING c > 1").num_rows if after_exit[1] else 0
        fault_outcome(lost=len(done_before - store.done_units("seeded")), duplicated=twice, silent_wrong=int(wrong),
                      stage=case, printed=printed, ledger=after_exit[0], exit_code=proc.returncode,
                      committed_by_this_launch=after_exit[0] - len(done_before))
    statuses = [r["status"] for p in ResultStore(results).parquet_files("launches", "seeded")
                for r in ResultStore(results).read_table(p).to_pylist()]
    final = _driver(spec, results)
    _, err = final.communicate(timeout=600)
    dupes = read_only_query(results, "SELECT unit_id, impl_a, impl_b, count(*) AS c FROM kdepth GROUP BY ALL HAVING c > 1")
    fault_outcome(lost=total - len(store.done_units("seeded")), duplicated=dupes.num_rows, silent_wrong=len(mismatches),
                  stage="the relaunch after three seeded SIGINT/SIGTERM", schedule=[(int(s), u, d) for s, u, d in SCHEDULE])
    assert not mismatches, mismatches
    assert statuses == ["interrupted"] * len(SCHEDULE), statuses
    assert final.returncode == 0, err[-3000:]
    assert len(store.done_units("seeded")) == total and dupes.num_rows == 0
    units = read_only_query(results, "SELECT count(*) AS n, count(DISTINCT unit_id) AS d FROM kdepth").to_pylist()[0]
    assert units["d"] == total


@pytest.mark.slow
@pytest.mark.parametrize("verbose", [False, True], ids=["default", "-v"])
def test_a_full_disk_mid_sweep_is_one_error_line_and_v_keeps_the_details(tmp_path: Path, verbose: bool,
                                                                         fault_outcome: Any) -> None:
    """Reproduced: a storage fault mid-sweep printed 1,374 lines (Ray's "Unhandled error" traceback
    of every unit in flight). Now: the start line, the stopping note and one error line; -v adds the
    worker's traceback of the fault."""
    spec = tmp_path / "spec.toml"
    spec.write_text(kill_spec_text("full", seeds=4))
    results = tmp_path / "results"
    proc = _driver(spec, results, *(["-v"] if verbose else []))
    head = _started(proc)
    store = ResultStore(results)
    deadline = time.time() + 240
    while len(store.done_units("full")) < 4:
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.1)
    done_at_fault = store.done_units("full")
    _break_attempts(results, "full")
    _, tail = proc.communicate(timeout=180)
    stderr = head + tail
    assert proc.returncode == 3, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "units are committed" in errors[0] and "fix the storage" in errors[0], stderr[-3000:]
    printed = int(COMMITTED.search(errors[0]).group(1))  # type: ignore[union-attr]
    twice = read_only_query(results, "SELECT unit_id, impl_a, impl_b, count(*) AS c FROM kdepth GROUP BY ALL HAVING c > 1")
    fault_outcome(lost=len(done_at_fault - store.done_units("full")), duplicated=twice.num_rows,
                  silent_wrong=int((printed, printed) != _ledger_counts(results, "full")),
                  stage=f"full disk mid-sweep ({'-v' if verbose else 'default'})", printed=printed)
    assert (printed, printed) == _ledger_counts(results, "full")
    assert "Unhandled error" not in stderr
    if verbose:
        assert "StorageFault" in stderr and "Not a directory" in stderr  # the worker's traceback, kept
    else:
        assert len(stderr.splitlines()) <= 4, stderr[-3000:]
        assert "Traceback" not in stderr and "File \"" not in stderr


def test_a_cancelled_unit_task_ends_its_worker_process(ray_local: Any, tmp_path: Path) -> None:
    """A cancel can land inside an import (the stack that left torch half-initialised in a worker and
    failed every later unit there): a task interrupted that way ends its process, and the next task
    runs in a clean one. The interrupt is raised in the task itself, as ``ray.cancel`` delivers it
    (whether a real cancel lands in time is Ray's, not what this checks)."""
    import ray

    @ray.remote(max_retries=0)
    def interrupted(pid_file: str) -> int:  # as orchestrator.worker.run_unit_task calls a unit
        from orchestrator.worker import ends_process_on_cancel

        def unit() -> int:
            with open(pid_file, "w") as fh:
                fh.write(str(os.getpid()))
            raise KeyboardInterrupt
        return ends_process_on_cancel(unit)()

    @ray.remote
    def whose() -> int:
        return os.getpid()

    pid_file = tmp_path / "pid"
    with pytest.raises(ray.exceptions.RayError):
        ray.get(interrupted.remote(str(pid_file)), timeout=120)
    pid = int(pid_file.read_text())
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"worker {pid} still runs after its task was interrupted")
    assert ray.get(whose.remote(), timeout=120) != pid
