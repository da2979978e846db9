"""One launcher per (results, sweep): the launch lock.

Two launchers of one sweep at once would interleave two plans in one partition, or compute the same
units twice. ``swapcheck sweep launch`` holds this lock from before it checks the sweep's identity
until it has recorded how the launch ended; a second launcher exits 2 naming the holder.

Two mechanisms, one contract (:class:`LaunchLock`: ``acquire()`` or :class:`LockHeld`, ``release()``):

* **Local filesystem** (a path, or ``file://``): ``_state/locks/sweep=<s>.lock`` held with an
  exclusive ``flock``. The kernel drops the lock when the holding process dies (SIGKILL included),
  so a dead holder can never block a relaunch and no timeout is guessed. The file's content names
  the holder (host, pid, since) for the message; its existence means nothing.
* **Object store** (``s3://``, ``gs://``; no locks, no conditional writes through pyarrow): a lease.
  Each launcher writes a claim ``_state/locks/sweep=<s>/<token>.json`` with an expiry, waits
  ``settle_s`` (longer than the store's modification-time resolution), then lists the claims: the
  unexpired claim with the earliest store-assigned modification time (ties broken by name) holds
  the lease, every other launcher deletes its claim and stops. Any claim written before my listing
  is in it, and any claim written after it has a later modification time than mine, so two
  launchers cannot both see themselves first. A live holder renews its lease every ``ttl_s / 6``
  seconds in a separate heartbeat object ``<token>.beat`` (the claim itself is never rewritten, so
  its place in the order stays); a holder that died stops renewing and its lease expires after
  ``ttl_s`` (default 120 s, ``SWAPCHECK_LEASE_TTL_S``), after which a launcher takes over. A claim whose holder ran on this
  machine (same host, boot and PID namespace) and whose process is gone (a SIGKILLed launcher) is
  void at once, so relaunching on the same machine after a kill is not held up by the lease. This relies on the store's read-after-write and list-after-write consistency (S3 and
  GCS give both) and on the launchers' clocks agreeing to well within ``ttl_s``.

**A holder stops before its lease can lapse.** A lease is only safe if its holder stops acting when it
can no longer renew it (a frozen or unreachable store): otherwise another launcher takes over while
it still runs. Each renewal is a put that is waited for only until the next deadline (a put that
hangs is abandoned, never waited out); after a failed renewal the next try follows in ``ttl_s / 24``
seconds. Measured from the start of the last renewal that succeeded (its ``expires_at`` was set then):

* after ``ttl_s / 2`` (60 s) without one the lease is *lost*: :attr:`LaunchLock.lost` is set,
  ``on_lost`` is called, and :meth:`LaunchLock.check` raises :class:`LeaseLost` (a ``StorageFault``,
  exit 3), so the launch stops starting units, records how it ended and exits;
* after ``ttl_s * 7 / 8`` (105 s) without one, if the lock is still held, ``on_expiry`` runs: by
  default the process prints one line and exits 3 at once (``os._exit``) -- the backstop, 15 s
  before any other launcher could see the lease expired. A late success before then renews the lease
  as usual (the launch has been told to stop all the same).

The renewal keeps trying after the lease is lost, so a launch that is stopping keeps its lease for as
long as the store answers.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from datetime import UTC, datetime
from typing import Any

import pyarrow.fs as pafs

from storage.errors import StorageError, StorageFault
from swapcheck_common.env import seconds_from_env

__all__ = ["DEFAULT_TTL_S", "LaunchLock", "LeaseLost", "LockHeld", "TTL_ENV", "lease_ttl_s"]

DEFAULT_TTL_S = 120.0
#: The environment variable that sets the lease's time to live (seconds) where ``ttl_s`` is not given.
TTL_ENV = "SWAPCHECK_LEASE_TTL_S"
#: Longer than the modification-time resolution of common object stores (1 s).
DEFAULT_SETTLE_S = 2.5
#: Fractions of ``ttl_s``: renewal interval, retry after a failed renewal, lost, stop at once.
RENEW_EVERY, RETRY_EVERY, LOST_AFTER, EXPIRY_STOP_AFTER = 1 / 6, 1 / 24, 1 / 2, 7 / 8


def lease_ttl_s() -> float:
    """The lease's time to live: ``SWAPCHECK_LEASE_TTL_S`` when set (3 to 3600 s), else 120 s."""
    return seconds_from_env(TTL_ENV, DEFAULT_TTL_S, 3.0, 3600.0, StorageError)


class LeaseLost(StorageFault):
    """The holder could not renew its lease in time: it must stop before another launcher may take over."""

    def __init__(self, sweep: str, where: str, silent_s: float, ttl_s: float, cause: str) -> None:
        detail = (f"lost the launch lease of sweep {sweep!r}: cannot renew it within {silent_s:.0f} s ({cause}); "
                  f"the lease lapses {ttl_s:g} s after its last renewal, when another launcher may take over, "
                  "so this launch stops. Fix the store, then relaunch the same spec to resume")
        super().__init__(where, detail)
        self.sweep, self.where, self.silent_s, self.ttl_s, self.cause = sweep, where, silent_s, ttl_s, cause

    def __reduce__(self) -> tuple[Any, ...]:
        return (LeaseLost, (self.sweep, self.where, self.silent_s, self.ttl_s, self.cause))


def _exit_now(exc: LeaseLost) -> None:
    """The backstop of a lease about to lapse under a live launch: one line, exit 3 at once."""
    try:
        sys.stdout.flush()
        sys.stderr.write(f"error: {exc}; stopped at once (exit 3)\n")
        sys.stderr.flush()
    finally:
        os._exit(3)


class LockHeld(StorageError):
    """Another launcher holds the sweep's lock; ``holder`` says who (host, pid, since)."""

    def __init__(self, sweep: str, where: str, holder: dict[str, Any]):
        self.sweep, self.where, self.holder = sweep, where, holder
        who = (f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}"
               if holder else "another launcher (no holder record readable)")
        super().__init__(
            f"sweep {sweep!r} in {where} is being launched by {who}. One launcher per sweep: wait for it "
            "to finish (or stop it), then relaunch to resume. Nothing was written.")


def _process_scope() -> str | None:
    """This machine's boot and PID namespace (Linux): two processes with equal scopes see the same
    PIDs, so one can tell whether the other is alive. None where it cannot be known."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def _me(token: str) -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": datetime.now(UTC).isoformat(timespec="seconds"),
            "token": token, "scope": _process_scope()}


def _provably_dead(claim: dict[str, Any]) -> bool:
    """The claim's holder ran on this machine, in this boot and PID namespace, and its process is gone
    (a SIGKILLed launcher): its lease is void now, not after ``ttl_s``. Anything unsure is alive."""
    scope, pid = claim.get("scope"), claim.get("pid")
    if scope is None or scope != _process_scope() or claim.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # exists, owned by someone else
    return False


class LaunchLock:
    """The lock of one sweep under one results root (a ``ResultStore``'s filesystem and base path)."""

    def __init__(self, fs: pafs.FileSystem, base: str, sweep: str, *, local: bool, ttl_s: float | None = None,
                 settle_s: float = DEFAULT_SETTLE_S, where: str | None = None,
                 on_lost: Callable[[LeaseLost], None] | None = None,
                 on_expiry: Callable[[LeaseLost], None] = _exit_now):
        """``ttl_s`` None: :func:`lease_ttl_s`. ``on_lost(exc)`` is called (from the renewal thread)
        when the lease is lost; ``on_expiry(exc)`` when it is about to lapse while still held
        (default: exit 3 at once). Both only for an object store's lease."""
        self.fs, self.base, self.sweep, self.local = fs, base.rstrip("/"), sweep, local
        self.ttl_s, self.settle_s = (lease_ttl_s() if ttl_s is None else ttl_s), settle_s
        self.where = where or base
        self.token = uuid.uuid4().hex
        self._fd: int | None = None
        self._claim: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._on_lost, self._on_expiry = on_lost, on_expiry
        #: Set when the lease could not be renewed in time (:meth:`check` raises then).
        self.lost = threading.Event()
        self._lost: LeaseLost | None = None
        self._last_ok = 0.0  # time.monotonic() at the start of the last successful write of the lease
        self._last_error = "no answer from the store"
        self._puts: ThreadPoolExecutor | None = None

    # -- public -------------------------------------------------------------------------------------
    def acquire(self) -> LaunchLock:
        if self.local:
            self._acquire_flock()
        else:
            self._acquire_lease()
        return self

    def release(self) -> None:
        if self._fd is not None:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._claim is not None:
            self._stop.set()  # no renewal, no deadline from here on
            if self._renewer is not None:
                self._renewer.join(timeout=5)
            claim, self._claim = self._claim, None

            def delete() -> None:
                for path in (claim, claim[: -len(".json")] + ".beat"):
                    try:
                        self.fs.delete_file(path)
                    except Exception:  # noqa: BLE001 - absent, an unreachable store, or pyarrow's S3
                        # finalized under this daemon thread as the process exits (seen: a thread
                        # traceback after the launch's own error line): the lease expires by itself
                        return

            # A frozen store must not hold the launch up: the deletes get a few seconds, then the
            # lease is left to expire by itself.
            deleter = threading.Thread(target=delete, name=f"lease-release-{self.sweep}", daemon=True)
            deleter.start()
            deleter.join(timeout=min(10.0, self.ttl_s / 4))
            if self._puts is not None:
                self._puts.shutdown(wait=False, cancel_futures=True)
                self._puts = None

    def check(self) -> None:
        """Raise :class:`LeaseLost` when the lease could not be renewed in time (the launch must stop)."""
        if self._lost is not None:
            raise self._lost

    def __enter__(self) -> LaunchLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- local: flock -------------------------------------------------------------------------------
    def _acquire_flock(self) -> None:
        import fcntl

        path = f"{self.base}/_state/locks/sweep={self.sweep}.lock"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a read-only file system, no permission, a full disk: nothing written
            raise StorageFault(path, f"cannot take the launch lock: {exc.strerror or exc}. Nothing was written") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # The holder writes its record just after taking the lock: give it a moment to appear.
            holder = self._read_local(fd)
            for _ in range(40):
                if holder.get("pid"):
                    break
                time.sleep(0.05)
                holder = self._read_local(fd)
            os.close(fd)
            raise LockHeld(self.sweep, self.where, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_me(self.token)).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    @staticmethod
    def _read_local(fd: int) -> dict[str, Any]:
        try:
            data = os.pread(fd, 4096, 0)
            holder: dict[str, Any] = json.loads(data) if data else {}
            return holder
        except (OSError, ValueError):
            return {}

    # -- object store: lease ------------------------------------------------------------------------
    def _claims_dir(self) -> str:
        return f"{self.base}/_state/locks/sweep={self.sweep}"

    def _write_claim(self, path: str) -> None:
        started = time.monotonic()
        body = {**_me(self.token), "written_at": time.time(), "expires_at": time.time() + self.ttl_s}
        with self.fs.open_output_stream(path) as out:
            out.write(json.dumps(body).encode())
        self._last_ok = started

    def _read_json(self, path: str) -> dict[str, Any] | None:
        try:
            with self.fs.open_input_stream(path) as fh:
                data: dict[str, Any] = json.loads(fh.read())
                return data
        except (OSError, ValueError):
            return None  # absent, deleted meanwhile, or half-visible

    def _claims(self) -> list[tuple[tuple[float, str], str, dict[str, Any]]]:
        """Every readable claim with its order key (store modification time, name), earliest first;
        a claim's ``expires_at`` is the later of its own and its heartbeat's."""
        infos = self.fs.get_file_info(pafs.FileSelector(self._claims_dir(), allow_not_found=True))
        out = []
        for info in infos:
            if info.type != pafs.FileType.File or not info.path.endswith(".json"):
                continue
            claim = self._read_json(info.path)
            if claim is None:
                continue
            beat = self._read_json(info.path[: -len(".json")] + ".beat") or {}
            claim["expires_at"] = max(float(claim.get("expires_at", 0)), float(beat.get("expires_at", 0)))
            mtime = info.mtime.timestamp() if info.mtime is not None else float(claim.get("written_at", 0))
            out.append(((mtime, info.base_name), info.path, claim))
        return sorted(out, key=lambda c: c[0])

    def _acquire_lease(self) -> None:
        bucket = self.base.split("/", 1)[0]  # an object store's path starts with its bucket
        if bucket and self.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise StorageError(f"--results {self.where}: there is no bucket {bucket!r} (or these credentials "
                               "cannot see it); create it first, swapcheck creates no buckets. Nothing was written")
        self.fs.create_dir(self._claims_dir(), recursive=True)
        mine = f"{self._claims_dir()}/{self.token}.json"
        self._write_claim(mine)
        time.sleep(self.settle_s)
        now = time.time()
        live = [(p, c) for _, p, c in self._claims()
                if p == mine or (c.get("expires_at", 0) > now and not _provably_dead(c))]
        holder_path, holder = live[0] if live else (mine, {})
        if holder_path != mine:
            try:
                self.fs.delete_file(mine)
            except OSError:
                pass
            raise LockHeld(self.sweep, self.where, holder)
        self._claim = mine
        self._stop.clear()
        self.lost.clear()
        self._lost = None
        self._puts = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lease-put-{self.sweep}")
        self._renewer = threading.Thread(target=self._renew, name=f"lease-{self.sweep}", daemon=True)
        self._renewer.start()

    def _beat(self, claim: str) -> float:
        """Write the heartbeat (the lease's new expiry); return when it started (``time.monotonic``)."""
        started = time.monotonic()
        with self.fs.open_output_stream(claim[: -len(".json")] + ".beat") as out:
            out.write(json.dumps({"expires_at": time.time() + self.ttl_s}).encode())
        return started

    def _renew(self) -> None:
        """Renew every ``ttl_s / 6``; declare the lease lost, then stop the process, when renewals
        fail past the deadlines (module docstring). Never waits on a put past the next deadline."""
        ttl = self.ttl_s
        next_at = self._last_ok + ttl * RENEW_EVERY
        pending: Future[float] | None = None
        pending_since = 0.0
        while not self._stop.is_set():
            claim, puts = self._claim, self._puts
            if claim is None or puts is None:
                return
            now = time.monotonic()
            lost_at, expiry_at = self._last_ok + ttl * LOST_AFTER, self._last_ok + ttl * EXPIRY_STOP_AFTER
            if pending is not None and not pending.done():
                self._last_error = f"the store has not answered a renewal for {now - pending_since:.0f} s"
            if now >= lost_at and self._lost is None:
                self._declare(now, self._on_lost)
            if now >= expiry_at:
                self._declare(now, self._on_expiry)
                return
            if pending is None and now >= next_at:
                try:
                    pending, pending_since = puts.submit(self._beat, claim), now
                except RuntimeError:  # released meanwhile
                    return
            deadline = min(expiry_at, lost_at if self._lost is None else expiry_at)
            if pending is not None:
                wait_futures([pending], timeout=max(0.0, deadline - now))
                if not pending.done():
                    continue  # a deadline came first: handled at the top of the loop
                try:
                    self._last_ok = max(self._last_ok, pending.result())
                    next_at = self._last_ok + ttl * RENEW_EVERY
                except Exception as exc:  # noqa: BLE001 - any failure of the put: try again soon
                    self._last_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
                    next_at = time.monotonic() + ttl * RETRY_EVERY
                pending = None
                continue
            self._stop.wait(max(0.0, min(next_at, deadline) - now))

    def _declare(self, now: float, action: Callable[[LeaseLost], None] | None) -> None:
        exc = LeaseLost(self.sweep, self.where, now - self._last_ok, self.ttl_s, f"last error: {self._last_error}")
        if self._lost is None:
            self._lost = exc
            self.lost.set()
        if action is not None and not self._stop.is_set():
            action(exc)
