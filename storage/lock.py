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
  launchers cannot both see themselves first. A live holder renews its lease every ``ttl_s / 3``
  seconds in a separate heartbeat object ``<token>.beat`` (the claim itself is never rewritten, so
  its place in the order stays); a holder that died stops renewing and its lease expires after
  ``ttl_s`` (default 120 s), after which a launcher takes over. A claim whose holder ran on this
  machine (same host, boot and PID namespace) and whose process is gone (a SIGKILLed launcher) is
  void at once, so relaunching on the same machine after a kill is not held up by the lease. This relies on the store's read-after-write and list-after-write consistency (S3 and
  GCS give both) and on the launchers' clocks agreeing to well within ``ttl_s``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pyarrow.fs as pafs

from storage.errors import StorageError

__all__ = ["LaunchLock", "LockHeld"]

DEFAULT_TTL_S = 120.0
#: Longer than the modification-time resolution of common object stores (1 s).
DEFAULT_SETTLE_S = 2.5


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

    def __init__(self, fs: pafs.FileSystem, base: str, sweep: str, *, local: bool, ttl_s: float = DEFAULT_TTL_S,
                 settle_s: float = DEFAULT_SETTLE_S, where: str | None = None):
        self.fs, self.base, self.sweep, self.local = fs, base.rstrip("/"), sweep, local
        self.ttl_s, self.settle_s = ttl_s, settle_s
        self.where = where or base
        self.token = uuid.uuid4().hex
        self._fd: int | None = None
        self._claim: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

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
            self._stop.set()
            if self._renewer is not None:
                self._renewer.join(timeout=5)
            for path in (self._claim, self._claim[: -len(".json")] + ".beat"):
                try:
                    self.fs.delete_file(path)
                except OSError:
                    pass  # absent, or an unreachable store: the lease expires by itself
            self._claim = None

    def __enter__(self) -> LaunchLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- local: flock -------------------------------------------------------------------------------
    def _acquire_flock(self) -> None:
        import fcntl

        path = f"{self.base}/_state/locks/sweep={self.sweep}.lock"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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
        body = {**_me(self.token), "written_at": time.time(), "expires_at": time.time() + self.ttl_s}
        with self.fs.open_output_stream(path) as out:
            out.write(json.dumps(body).encode())

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
        self._renewer = threading.Thread(target=self._renew, name=f"lease-{self.sweep}", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            claim = self._claim
            if claim is None:
                return
            try:
                with self.fs.open_output_stream(claim[: -len(".json")] + ".beat") as out:
                    out.write(json.dumps({"expires_at": time.time() + self.ttl_s}).encode())
            except OSError:
                continue  # retried at the next tick; the lease lasts ttl_s
