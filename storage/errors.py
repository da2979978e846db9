"""Errors of the storage layer (light module: the CLI imports it at start-up)."""

from __future__ import annotations

from swapcheck_common.errors import InputError


class StorageError(InputError):
    """A named error of the storage layer: a message for the user, nothing half-written (exit code 2)."""


class QueryError(StorageError, ValueError):
    """A query was refused or failed; nothing was changed."""


class StorageFault(StorageError):
    """The results tree could not be read or written (permission, disk full, store unreachable).

    An infrastructure fault, never a unit's result: the sweep stops. ``path`` is where it happened,
    ``detail`` the underlying error. Pickles whole (it crosses from Ray workers to the driver).
    """

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(path, detail)
        self.path = path
        self.detail = detail

    def __str__(self) -> str:
        return f"storage fault at {self.path}: {self.detail}"


class PathEscape(StorageError):
    """A path read from a record (a ledger row's ``files``, an artifact's path) that leaves the folder
    it must stay in: ``..``, an absolute path, a URI, a symlink out of a local root, another
    partition. An integrity problem of the record: the path is never followed (read, moved, deleted)."""

    def __init__(self, path: object, why: str) -> None:
        super().__init__(path, why)
        self.path = path
        self.why = why

    def __str__(self) -> str:
        return f"path {self.path!r} {self.why}; not followed"


class DamagedRecord(StorageError):
    """A record of the tree that a command needs is damaged (unreadable, a page checksum fails, a
    foreign schema, not the one row it must hold): named with ``path`` and ``why``; nothing changed."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(path, why)
        self.path = path
        self.why = why

    def __str__(self) -> str:
        return f"{self.path} is damaged ({self.why})"
