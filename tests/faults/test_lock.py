"""The launch lock: one launcher per (results, sweep), on a local disk and on an object store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from storage.lock import LaunchLock, LockHeld
from tests.conftest import REPO


def _local(root: Path, sweep: str = "s") -> LaunchLock:
    return LaunchLock(pafs.LocalFileSystem(), str(root), sweep, local=True)


def test_local_lock_names_the_holder_and_is_released(tmp_path: Path) -> None:
    first = _local(tmp_path).acquire()
    with pytest.raises(LockHeld) as held:
        _local(tmp_path).acquire()
    assert f"pid {os.getpid()}" in str(held.value) and "Nothing was written" in str(held.value)
    assert held.value.holder["host"]
    _local(tmp_path, "other-sweep").acquire().release()  # locks are per sweep
    first.release()
    _local(tmp_path).acquire().release()


HOLD = """
import sys, time, pyarrow.fs as pafs
from storage.lock import LaunchLock
LaunchLock(pafs.LocalFileSystem(), sys.argv[1], "s", local=True).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_holder_killed_with_sigkill_does_not_block_the_next_launcher(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld, match=f"pid {proc.pid}"):
            _local(tmp_path).acquire()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    _local(tmp_path).acquire().release()  # the kernel dropped the dead holder's lock


def _lease(root: Path, ttl_s: float = 30.0) -> LaunchLock:
    """The object-store protocol (claims, settle, heartbeats), run over a local directory: real,
    distinct modification times, as an object store assigns them."""
    return LaunchLock(pafs.LocalFileSystem(), str(root), "s", local=False, ttl_s=ttl_s, settle_s=0.2)


def test_object_store_lease_admits_exactly_one_of_racing_launchers(tmp_path: Path) -> None:
    outcomes: list[object] = []
    barrier = threading.Barrier(4)

    def attempt() -> None:
        lock = _lease(tmp_path)
        barrier.wait()
        try:
            outcomes.append(lock.acquire())
        except LockHeld as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if isinstance(o, LaunchLock)]
    assert len(winners) == 1 and sum(isinstance(o, LockHeld) for o in outcomes) == 3
    winners[0].release()
    _lease(tmp_path).acquire().release()


def test_object_store_lease_of_a_dead_holder_expires(tmp_path: Path) -> None:
    dead = _lease(tmp_path, ttl_s=0.6).acquire()
    dead._stop.set()  # the holder dies: no more heartbeats, its claim stays behind
    dead._claim = None
    with pytest.raises(LockHeld):
        _lease(tmp_path).acquire()
    time.sleep(0.7)
    taker = _lease(tmp_path).acquire()
    taker.release()
