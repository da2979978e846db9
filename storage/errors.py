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
