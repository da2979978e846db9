"""Records read and checked once, kept on this machine by file identity (issue #39).

A relaunch of a finished sweep reads two records whose size grows with the sweep: the ledger's
checkpoint (hashed whole against the SHA-256 its name records, every page checksum verified, then
each row's ``unit_id`` and ``status`` decoded) and the spec record (every planned unit's id). At
100,000 units that is about 20 ms of hashing and decoding per relaunch for files that have not
changed since the last one; a catalog open binds a compacted sweep's files from every row's file
records (storage.catalog: ``catalog-binding``), 0.2-0.5 s more. So what such a read found is kept,
as Arrow (IPC) and JSON notes, under :func:`storage.files.cache_dir` ``/reads``, and reused when
the file's identity is unchanged.

The trust is the verified-files cache's (storage.catalog.VerifiedFiles), for the same reasons:

* **identity**: local files only (size, mtime, ctime, inode, device; any write changes the ctime,
  which no user call can set back, and a replace the inode). Object stores are read every time;
* **a signature**: each entry is an HMAC-SHA256, with the results tree's secret
  (``_state/verified-files.key``), of the file's path, its identity, when it was read and the
  SHA-256 of the Arrow bytes kept. An entry written without the secret is ignored, as is any entry
  when the tree has no secret;
* **an age**: an entry read more than ``SWAPCHECK_REHASH_AFTER_S`` seconds ago (default one day) is
  not trusted: the file is read and checked again, so bit rot under an unchanged identity is found
  within a day by relaunches too (``sweep verify`` never uses this cache and finds it at once).

Unreadable, unwritable or damaged, the cache is ignored and the record read whole: it only ever
saves a read, never makes a record trusted that a full read would refuse.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from storage.errors import StorageError
from storage.files import REHASH_DEFAULT_S, REHASH_ENV, cache_dir, write_cache_file
from swapcheck_common.env import seconds_from_env

if TYPE_CHECKING:
    from storage.store import ResultStore

__all__ = ["ReadCache"]

FORMAT = 1


class ReadCache:
    """The kept reads of one results store (module docstring)."""

    def __init__(self, store: ResultStore, key: Callable[[], bytes | None]) -> None:
        """``key``: reads the results tree's signing secret (storage.store.cache_key), or None."""
        self.store = store
        folder = cache_dir() if store.local else None
        self._key = key() if folder is not None else None
        self.folder = folder / "reads" if folder is not None and self._key is not None else None
        self._root = os.path.realpath(store.base) if store.local else ""
        age_s = seconds_from_env(REHASH_ENV, REHASH_DEFAULT_S, 0.0, 10 * 365 * 86_400.0, StorageError)
        self._fresh_ns = time.time_ns() - int(age_s * 1e9)

    def _path(self, rel: str, what: str) -> Path:
        assert self.folder is not None
        name = hashlib.sha256(f"{self._root}\0{rel}\0{what}".encode("utf-8", "surrogateescape")).hexdigest()[:40]
        return self.folder / f"{name}.v{FORMAT}.arrows"

    def _mac(self, header: dict[str, Any]) -> str:
        assert self._key is not None
        body = json.dumps({k: v for k, v in header.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()

    def get(self, rel: str, identity: list[Any] | None, what: str) -> tuple[pa.Table, dict[str, Any]] | None:
        """What was kept of ``rel`` (``what``: which read of it) while its identity was ``identity``,
        and the notes kept with it; None when nothing trustworthy is kept."""
        if self.folder is None or identity is None:
            return None
        try:
            with open(self._path(rel, what), "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        head, sep, body = data.partition(b"\n")
        try:
            header = json.loads(head)
            if (not sep or not isinstance(header, dict) or header.get("format") != FORMAT
                    or header.get("rel") != rel or header.get("what") != what or header.get("identity") != identity
                    or not isinstance(header.get("read_ns"), int) or header["read_ns"] < self._fresh_ns
                    or not isinstance(header.get("mac"), str)
                    or not hmac.compare_digest(header["mac"], self._mac(header))
                    or hashlib.sha256(body).hexdigest() != header.get("body_sha256")):
                return None
            table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
        except (ValueError, pa.ArrowException, RecursionError):
            return None
        return table, dict(header.get("notes") or {})

    def put(self, rel: str, identity: list[Any] | None, what: str, table: pa.Table,
            notes: dict[str, Any] | None = None) -> None:
        """Keep ``table`` as what reading ``rel`` (identity ``identity``) found; never fails."""
        if self.folder is None or identity is None:
            return
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        body = sink.getvalue().to_pybytes()
        header: dict[str, Any] = {"format": FORMAT, "rel": rel, "what": what, "identity": identity,
                                  "read_ns": time.time_ns(), "notes": notes or {},
                                  "body_sha256": hashlib.sha256(body).hexdigest()}
        header["mac"] = self._mac(header)
        write_cache_file(self._path(rel, what),
                         json.dumps(header, sort_keys=True, separators=(",", ":")).encode() + b"\n" + body)
