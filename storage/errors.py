"""Errors of the storage layer (light module: the CLI imports it at start-up)."""

from __future__ import annotations


class StorageError(Exception):
    """A named error of the storage layer: a message for the user, nothing half-written."""


class QueryError(StorageError, ValueError):
    """A query was refused or failed; nothing was changed."""
