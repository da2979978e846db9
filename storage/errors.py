"""Errors of the storage layer (light module: the CLI imports it at start-up)."""

from __future__ import annotations


class QueryError(ValueError):
    """A query was refused or failed; nothing was changed."""
