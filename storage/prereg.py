"""Pre-registered prediction files: their model, the one parser, and the registrations a sweep holds.

A prediction file (TOML, beside the spec under ``sweeps/prereg/``) states what the sweep will show;
``sweep launch`` (``orchestrator.prereg``) validates it with :func:`parse` and records its SHA-256
and text in the ``preregistrations`` table before any unit runs; ``report predictions``
(``reports.predictions``) reads the registered text back with the same :func:`parse` and scores
it. One model, one parser, for both: it lives here because both layers may import ``storage``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from storage.errors import StorageError
from swapcheck_common.toml_model import TomlModelError, load_toml_model

__all__ = ["Prediction", "PredictionFile", "PredictionFileError", "parse", "registrations", "sha256"]


class Prediction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    id: str = Field(min_length=1)
    statement: str = Field(min_length=1)
    table: str
    where: str = "true"
    every: str | None = None
    aggregate: str | None = None
    measure: str | None = None
    label: str | None = None
    noun: str = "rows"

    @model_validator(mode="after")
    def _one_test(self) -> Prediction:
        if (self.every is None) == (self.aggregate is None):
            raise ValueError("give exactly one of `every` (each matching row) or `aggregate` (all of them)")
        return self


class PredictionFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    sweep: str
    description: str | None = None
    author: str | None = None
    amends: str | None = None
    predictions: list[Prediction] = Field(min_length=1)

    @field_validator("predictions")
    @classmethod
    def _distinct_ids(cls, v: list[Prediction]) -> list[Prediction]:
        ids = [p.id for p in v]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate ids {dupes}")
        return v


class PredictionFileError(StorageError, TomlModelError):
    """A prediction file is not valid TOML or not a valid prediction file (``problems`` names each
    field path): exit 2."""


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parse(text: str, path: str) -> PredictionFile:
    """The one parser of prediction files, at registration and when scoring the registered text.

    TOML through the one loader (``swapcheck_common.toml_model``), validated into :class:`PredictionFile`;
    :class:`PredictionFileError` naming the file and every field path otherwise.
    """
    try:
        return load_toml_model(text, path, PredictionFile)
    except TomlModelError as exc:
        raise PredictionFileError(exc.path, exc.problems) from None


def registrations(store: Any, sweep: str) -> list[dict[str, Any]]:
    """The sweep's registered prediction files (path, sha256, amends, text, ...), oldest first."""
    rows: list[dict[str, Any]] = store.records(sweep).registrations()
    return rows
